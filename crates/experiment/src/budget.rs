//! What a run will ask of this host, estimated from its spec before
//! anything is allocated: host memory (the simulated machine's frames,
//! TLBs, caches and threads) and work (the operations the simulator loops
//! over). A spec whose estimate is above the budget is refused with the key
//! that drives it (exit status 2), instead of aborting on an allocation or
//! running for days: `runs = 10^12`, `workload.steps = 10^12`,
//! `machine.memory_mb = 10^11` were all accepted before.
//!
//! The estimate is built from each part's upper bound where the spec gives
//! one (a TLB is allocated whole, a frame is 4 KiB) and from the
//! workload's own [`Demand`](mmulab_workloads::Demand) otherwise; its
//! constants were checked against the peak RSS of real runs (see
//! `budget_estimates_cover_measured_peaks` in `tests/cli.rs`).

use mmulab_machine::TlbConfig;

use crate::spec::{Spec, SpecError};

/// Default ceiling of `--max-work`: 10^12 operations, about nine hours at
/// the 30 M references a second `mmulab bench` measures on one core here.
pub const DEFAULT_MAX_WORK: u64 = 1_000_000_000_000;

/// Host bytes per simulated frame: the 4 KiB of data and its bookkeeping
/// (the frame's slot, the page's entry in its object, its oracle slot).
const FRAME_BYTES: u64 = 4096 + 128;
/// Host bytes per TLB entry: the entry, its replacement stamp, two hint slots.
const TLB_ENTRY_BYTES: u64 = 64 + 8 + 2 * 4;
/// Host bytes per cache line: tag, state and metadata words.
const CACHE_LINE_BYTES: u64 = 32;
/// Host bytes per thread created: its coroutine, its program and its
/// task's bookkeeping, which stay until the run ends.
const THREAD_BYTES: u64 = 16 * 1024;
/// The simulator, its queues and the results, whatever the spec.
const BASE_BYTES: u64 = 32 << 20;

/// The ceilings a run is checked against.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub struct Budget {
    /// Host memory the run may take (`--max-memory`; default: this
    /// machine's available memory).
    pub max_memory_bytes: u64,
    /// Operations the run may take (`--max-work`; default
    /// [`DEFAULT_MAX_WORK`]).
    pub max_work: u64,
}

impl Budget {
    /// This machine's available memory and the default work ceiling.
    pub fn for_this_host() -> Budget {
        Budget {
            max_memory_bytes: available_memory_bytes().unwrap_or(u64::MAX),
            max_work: DEFAULT_MAX_WORK,
        }
    }
}

/// `MemAvailable` of /proc/meminfo: what the kernel says can be had without
/// swapping. None off Linux.
pub fn available_memory_bytes() -> Option<u64> {
    let text = std::fs::read_to_string("/proc/meminfo").ok()?;
    let line = text.lines().find(|l| l.starts_with("MemAvailable:"))?;
    let kib: u64 = line.split_whitespace().nth(1)?.parse().ok()?;
    Some(kib.saturating_mul(1024))
}

/// Parses a size: bytes, or a number with a binary suffix K, M, G or T
/// (`512M`, `8G`, `1.5G`).
pub fn parse_size(s: &str) -> Result<u64, String> {
    let t = s.trim();
    let (num, mult) = match t.char_indices().last() {
        Some((i, c)) if c.is_ascii_alphabetic() => {
            let m: u64 = match c.to_ascii_uppercase() {
                'K' => 1 << 10,
                'M' => 1 << 20,
                'G' => 1 << 30,
                'T' => 1 << 40,
                _ => return Err(format!("{s:?}: the suffix must be K, M, G or T")),
            };
            (&t[..i], m)
        }
        _ => (t, 1),
    };
    let v: f64 = num
        .parse()
        .map_err(|_| format!("{s:?}: expected a size such as 512M, 8G or 1073741824"))?;
    if !(v.is_finite() && v > 0.0) {
        return Err(format!("{s:?}: a size must be positive"));
    }
    let bytes = v * mult as f64;
    Ok(if bytes >= u64::MAX as f64 {
        u64::MAX
    } else {
        bytes as u64
    })
}

/// Parses a count: an integer, or a number in scientific notation
/// (`1e12`).
pub fn parse_count(s: &str) -> Result<u64, String> {
    let t = s.trim();
    if let Ok(v) = t.parse::<u64>() {
        return Ok(v);
    }
    match t.parse::<f64>() {
        Ok(v) if v.is_finite() && v >= 0.0 => Ok(if v >= u64::MAX as f64 {
            u64::MAX
        } else {
            v as u64
        }),
        _ => Err(format!("{s:?}: expected a count such as 1000000 or 1e12")),
    }
}

/// A run's estimate, each figure with the key that drives it.
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct Estimate {
    pub memory_bytes: u64,
    /// The key of the largest part of the memory.
    pub memory_key: String,
    /// Operations over all runs.
    pub work: u64,
    /// The key that makes the work large: `runs` or a workload key.
    pub work_key: String,
    /// Operations of one run.
    pub work_per_run: u64,
}

fn mib(b: u64) -> String {
    if b >= 1 << 40 {
        format!("{:.1} TiB", b as f64 / (1u64 << 40) as f64)
    } else if b >= 1 << 30 {
        format!("{:.1} GiB", b as f64 / (1u64 << 30) as f64)
    } else {
        format!("{:.0} MiB", b as f64 / (1u64 << 20) as f64)
    }
}

impl Spec {
    /// The host memory and work this (validated) spec's run needs.
    pub fn estimate(&self) -> Estimate {
        let m = &self.machine;
        let cpus = m.cpus as u64;
        let d = self.workload.demand(m.cpus);
        let mut parts: Vec<(String, u64)> = Vec::new();
        // Frames are allocated as they are first touched: what the
        // workload may hold, with its page tables, and never more than the
        // machine has.
        let frames = d
            .pages
            .saturating_add(d.pages / 256)
            .saturating_add(1024)
            .min(m.memory_mb.saturating_mul(256));
        parts.push((
            format!("workload.{}", d.pages_key),
            frames.saturating_mul(FRAME_BYTES),
        ));
        let tlbs_per_cpu = if self.memory.is_some() { 2 } else { 1 };
        parts.push((
            "machine.tlb.entries".into(),
            (m.tlb.entries as u64)
                .saturating_mul(cpus)
                .saturating_mul(tlbs_per_cpu)
                .saturating_mul(TLB_ENTRY_BYTES),
        ));
        if let Some(mem) = &self.memory {
            let lines = |c: &mmulab_memsys::CacheConfig| c.size_bytes / c.block_bytes.max(1);
            let l1 = (lines(&mem.l1i) + lines(&mem.l1d)).saturating_mul(cpus);
            let key = if lines(&mem.l2) >= l1 {
                "memory.l2.size_bytes"
            } else {
                "memory.l1d.size_bytes"
            };
            parts.push((
                key.into(),
                l1.saturating_add(lines(&mem.l2))
                    .saturating_mul(CACHE_LINE_BYTES),
            ));
        }
        parts.push((
            format!("workload.{}", d.spawned_key),
            d.spawned.saturating_mul(THREAD_BYTES),
        ));
        let memory_bytes = parts
            .iter()
            .fold(BASE_BYTES, |a, (_, b)| a.saturating_add(*b));
        let memory_key = parts
            .iter()
            .max_by_key(|(_, b)| *b)
            .map(|(k, _)| k.clone())
            .expect("parts");
        // No CPU makes more than one reference per `ref_cycles` of
        // simulated time, and a run stops at `engine.max_cycles`.
        let time_bound = cpus
            .saturating_mul(self.engine.max_cycles / self.costs.ref_cycles.max(1))
            .max(1);
        let work_per_run = d.work.clamp(1, time_bound);
        let work = work_per_run.saturating_mul(self.runs);
        // The workload's key drives the work even when the time limit
        // caps it (raising engine.max_cycles would not help).
        let work_key = if self.runs > work_per_run {
            "runs".to_string()
        } else {
            format!("workload.{}", d.work_key)
        };
        Estimate {
            memory_bytes,
            memory_key,
            work,
            work_key,
            work_per_run,
        }
    }

    /// Refuses a run whose estimate is above `budget`, naming the key that
    /// drives it; returns the estimate otherwise.
    pub fn check_budget(&self, budget: &Budget) -> Result<Estimate, SpecError> {
        let e = self.estimate();
        if e.memory_bytes > budget.max_memory_bytes {
            return Err(SpecError::Invalid(format!(
                "{}: the run needs about {} of host memory, above --max-memory ({}; default: this machine's available memory)",
                e.memory_key,
                mib(e.memory_bytes),
                mib(budget.max_memory_bytes)
            )));
        }
        if e.work > budget.max_work {
            return Err(SpecError::Invalid(format!(
                "{}: the run needs about {:.1e} simulated operations ({} run(s) of about {:.1e}), above --max-work ({:.1e}; raise it to run anyway)",
                e.work_key, e.work as f64, self.runs, e.work_per_run as f64, budget.max_work as f64
            )));
        }
        Ok(e)
    }
}

/// Checks the TLB part's constant against the structure it stands for.
const _: () = assert!(TLB_ENTRY_BYTES >= std::mem::size_of::<mmulab_machine::TlbEntry>() as u64);
const _: () = assert!(TlbConfig::MAX_ENTRIES > 0);

#[cfg(test)]
mod tests {
    use super::*;

    const BASE: &str = "protocol = \"global\"\n[workload]\nkind = \"tester\"\nchildren = 2\n";

    fn spec(sets: &[&str]) -> Spec {
        let sets: Vec<String> = sets.iter().map(|s| s.to_string()).collect();
        Spec::parse(BASE, &sets, "t").unwrap()
    }

    #[test]
    fn sizes_parse_with_binary_suffixes() {
        assert_eq!(parse_size("512M"), Ok(512 << 20));
        assert_eq!(parse_size("8g"), Ok(8 << 30));
        assert_eq!(parse_size("1.5K"), Ok(1536));
        assert_eq!(parse_size("4096"), Ok(4096));
        assert!(parse_size("lots").is_err());
        assert!(parse_size("-1G").is_err());
        assert!(parse_size("5Q").is_err());
        assert_eq!(parse_count("1e12"), Ok(1_000_000_000_000));
        assert_eq!(parse_count("42"), Ok(42));
        assert!(parse_count("-1").is_err() && parse_count("many").is_err());
    }

    #[test]
    fn a_small_spec_fits_and_runs_drive_the_work() {
        let b = Budget {
            max_memory_bytes: 1 << 30,
            max_work: DEFAULT_MAX_WORK,
        };
        let e = spec(&[]).check_budget(&b).unwrap();
        assert!(e.memory_bytes < 1 << 30, "{e:?}");
        let err = spec(&["runs=1000000000000"]).check_budget(&b).unwrap_err();
        assert!(err.to_string().starts_with("runs:"), "{err}");
    }

    #[test]
    fn memory_refusal_names_the_key_that_drives_it() {
        let b = Budget {
            max_memory_bytes: 256 << 20,
            max_work: DEFAULT_MAX_WORK,
        };
        let s = spec(&[
            "workload={kind=\"bench\", threads=4, private_pages=50000}",
            "machine.memory_mb=4096",
        ]);
        let err = s.check_budget(&b).unwrap_err().to_string();
        assert!(err.starts_with("workload.private_pages:"), "{err}");
        let s = spec(&["machine.tlb.entries=1048576", "machine.tlb.ways=1"]);
        let err = s.check_budget(&b).unwrap_err().to_string();
        assert!(err.starts_with("machine.tlb.entries:"), "{err}");
    }
}
