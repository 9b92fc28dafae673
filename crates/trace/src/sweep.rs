//! Lock-step direct simulation of many TLB configurations over one trace.
//!
//! The trace is read once; each batch is run through every configuration while it is hot
//! in the cache (Tapeworm, uhlig94 §3.2, likewise drove many simulated configurations from
//! one stream). Fully associative LRU sizes are better served by [`crate::mattson`].

use std::path::Path;

use crate::sim::{Policy, SimOptions, SimResult, Tlb};
use crate::source::{ReadOptions, open_trace};
use crate::{PageRef, Result, TraceError};

/// References given to each configuration in turn (fits in L1 with the TLB state).
const STEP: usize = 4096;

/// One `--ways` value of `mmulab trace sim`: a number of entries per set, or `full`
/// (fully associative, whatever the size).
pub fn parse_ways(s: &str) -> Result<Option<u32>> {
    match s.trim() {
        "full" => Ok(None),
        n => n.parse().map(Some).map_err(|_| {
            TraceError::InvalidOptions(format!("ways {s:?}: expected a number or `full`"))
        }),
    }
}

/// Every combination of the lists, in the order `mmulab trace sim` prints them: entries
/// outermost, then ways, then policy. Each is validated, and an invalid one is named.
pub fn grid(
    entries: &[u32],
    ways: &[Option<u32>],
    policies: &[Policy],
    page_size: u64,
    seed: u64,
) -> Result<Vec<SimOptions>> {
    let mut configs = Vec::with_capacity(entries.len() * ways.len() * policies.len());
    for &entries in entries {
        for &ways in ways {
            for &policy in policies {
                let o = SimOptions {
                    entries,
                    ways,
                    policy,
                    page_size,
                    seed,
                };
                o.validate().map_err(|e| {
                    let way = ways.map_or("full".to_string(), |w| w.to_string());
                    TraceError::InvalidOptions(format!(
                        "--entries {entries} with --ways {way}: {e}"
                    ))
                })?;
                configs.push(o);
            }
        }
    }
    Ok(configs)
}

/// Simulates every configuration over an in-memory trace.
pub fn sweep_refs(refs: &[PageRef], configs: &[SimOptions]) -> Result<Vec<SimResult>> {
    let mut tlbs = configs.iter().map(Tlb::new).collect::<Result<Vec<_>>>()?;
    for chunk in refs.chunks(STEP) {
        for t in &mut tlbs {
            t.run(chunk);
        }
    }
    Ok(tlbs.iter().map(Tlb::result).collect())
}

/// Simulates every configuration over the trace at `path`, read once. All configurations
/// must share one page size.
pub fn sweep(path: &Path, configs: &[SimOptions], read: &ReadOptions) -> Result<Vec<SimResult>> {
    let Some(first) = configs.first() else {
        return Ok(Vec::new());
    };
    if let Some(c) = configs.iter().find(|c| c.page_size != first.page_size) {
        return Err(TraceError::InvalidOptions(format!(
            "a sweep reads the trace once, at one page size: {} and {} differ",
            first.page_size, c.page_size
        )));
    }
    let mut tlbs = configs.iter().map(Tlb::new).collect::<Result<Vec<_>>>()?;
    let mut src = open_trace(path, first.page_size, read)?;
    let mut batch = Vec::new();
    while src.next_batch(&mut batch)? {
        for chunk in batch.chunks(STEP) {
            for t in &mut tlbs {
                t.run(chunk);
            }
        }
    }
    let warnings = src.warnings();
    Ok(tlbs
        .iter()
        .map(|t| {
            let mut r = t.result();
            r.warnings = warnings.clone();
            r
        })
        .collect())
}
