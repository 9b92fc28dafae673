//! Per-page consistency of a recorded history (issue #23, "Every fault
//! test's history is checked for consistency").
//!
//! A fault test records, for each page, every operation its programs ran:
//! the process, read or write, the value, and the real-time interval
//! around the access (CLOCK_MONOTONIC, one clock for every process of the
//! machine). A page's history is *sequentially consistent* when one total
//! order of its operations keeps each process's own order (by time: a
//! process runs its operations one after another) and has every read
//! return the value of the latest write before it (the initial value
//! before any). That is what Mirage promises per page even across faults:
//! a site cut off keeps reading its read copy, which may be stale by
//! then, but no process ever sees a value go back, nor a value nobody
//! wrote (fleisch89 §5: coherence before availability).
//!
//! Operations that failed (SIGBUS) have no value and are not recorded. A
//! write whose outcome is unknown (its process died between the access
//! and the report) is *pending*: the order may place it or leave it out.
//!
//! The check searches the orders (depth first over the processes' next
//! operations, each state (position per process, current value) visited
//! once): exact, and cheap for the few processes and hundreds of
//! operations of a test. A failure names the page, the values and the
//! operations that no order can place.

use std::collections::{BTreeMap, BTreeSet, HashSet};

#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum OpKind {
    Read,
    Write,
}

/// One operation on one page.
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct Op {
    pub process: String,
    pub kind: OpKind,
    pub value: u64,
    pub start_ns: u64,
    /// None: a write whose outcome is unknown.
    pub end_ns: Option<u64>,
}

impl std::fmt::Display for Op {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        let k = match self.kind {
            OpKind::Read => "read",
            OpKind::Write => "write",
        };
        match self.end_ns {
            Some(e) => write!(
                f,
                "{} {k} {} [{:.3}, {:.3}] ms",
                self.process,
                self.value,
                self.start_ns as f64 / 1e6,
                e as f64 / 1e6
            ),
            None => write!(
                f,
                "{} {k} {} [{:.3}, ?] ms (outcome unknown)",
                self.process,
                self.value,
                self.start_ns as f64 / 1e6
            ),
        }
    }
}

/// Checks one page's history; `initial` is the page's value before any
/// write (0 for a new segment).
pub fn check_sequential(page: &str, ops: &[Op], initial: u64) -> Result<(), String> {
    let written: BTreeSet<u64> = ops
        .iter()
        .filter(|o| o.kind == OpKind::Write)
        .map(|o| o.value)
        .collect();
    for o in ops {
        if o.kind == OpKind::Read && o.value != initial && !written.contains(&o.value) {
            return Err(format!(
                "page {page}: {o}: a value no process wrote (initial {initial}, written {written:?})"
            ));
        }
    }
    // Each process's operations in its own order.
    let mut by_process: BTreeMap<&str, Vec<&Op>> = BTreeMap::new();
    for o in ops {
        by_process.entry(o.process.as_str()).or_default().push(o);
    }
    let seqs: Vec<Vec<&Op>> = by_process
        .into_values()
        .map(|mut v| {
            v.sort_by_key(|o| o.start_ns);
            v
        })
        .collect();
    let total: usize = seqs.iter().map(Vec::len).sum();
    let mut seen: HashSet<(Vec<usize>, u64)> = HashSet::new();
    let mut best: (usize, Vec<usize>, u64) = (0, vec![0; seqs.len()], initial);
    // Depth-first search with an explicit stack (no recursion limit).
    let mut stack = vec![(vec![0usize; seqs.len()], initial)];
    while let Some((pos, cur)) = stack.pop() {
        if !seen.insert((pos.clone(), cur)) {
            continue;
        }
        let placed: usize = pos.iter().sum();
        if placed > best.0 {
            best = (placed, pos.clone(), cur);
        }
        if placed == total {
            return Ok(());
        }
        for (p, seq) in seqs.iter().enumerate() {
            let Some(o) = seq.get(pos[p]) else { continue };
            let mut next = pos.clone();
            next[p] += 1;
            match o.kind {
                OpKind::Read if o.value == cur => stack.push((next, cur)),
                OpKind::Read => {}
                OpKind::Write => {
                    // A pending write may also never have happened.
                    if o.end_ns.is_none() {
                        stack.push((next.clone(), cur));
                    }
                    stack.push((next, o.value));
                }
            }
        }
    }
    let (placed, pos, cur) = best;
    let stuck: Vec<String> = seqs
        .iter()
        .enumerate()
        .filter_map(|(p, s)| s.get(pos[p]).map(|o| o.to_string()))
        .collect();
    Err(format!(
        "page {page}: not sequentially consistent: at most {placed} of {total} operations fit one order; then the value is {cur} and no process's next operation fits: {}",
        stuck.join("; ")
    ))
}

/// Parses a `dsmtool` output's timed lines (`R P V T0 T1`, `T P V T0
/// T1`) into operations of `process`, by page. `pending`: a write the
/// program was told to make after its last reported one, outcome
/// unknown (page, value, from when).
pub fn parse_dsmtool(
    process: &str,
    stdout: &str,
    pending: Option<(u32, u64, u64)>,
) -> BTreeMap<u32, Vec<Op>> {
    let mut out: BTreeMap<u32, Vec<Op>> = BTreeMap::new();
    for line in stdout.lines() {
        let f: Vec<&str> = line.split_whitespace().collect();
        let kind = match f.first() {
            Some(&"R") => OpKind::Read,
            Some(&"T") => OpKind::Write,
            _ => continue,
        };
        let num = |i: usize| f.get(i).and_then(|v| v.parse::<i64>().ok());
        let (Some(p), Some(v), Some(t0), Some(t1)) = (num(1), num(2), num(3), num(4)) else {
            continue;
        };
        out.entry(p as u32).or_default().push(Op {
            process: process.to_string(),
            kind,
            value: v as u64,
            start_ns: t0 as u64,
            end_ns: Some(t1 as u64),
        });
    }
    if let Some((page, value, from)) = pending {
        out.entry(page).or_default().push(Op {
            process: process.to_string(),
            kind: OpKind::Write,
            value,
            start_ns: from,
            end_ns: None,
        });
    }
    out
}

#[cfg(test)]
mod tests {
    use super::*;

    fn op(p: &str, kind: OpKind, value: u64, t: u64) -> Op {
        Op {
            process: p.into(),
            kind,
            value,
            start_ns: t,
            end_ns: Some(t + 1),
        }
    }
    use OpKind::{Read as R, Write as W};

    #[test]
    fn a_coherent_history_passes_and_a_stale_copy_alone_is_allowed() {
        let h = vec![
            op("a", W, 1, 0),
            op("b", R, 1, 10),
            op("a", W, 2, 20),
            // b still reads 1 after a wrote 2 (a cut-off read copy):
            // sequentially consistent, b never saw 2.
            op("b", R, 1, 30),
            op("b", R, 2, 40),
        ];
        assert_eq!(check_sequential("0", &h, 0), Ok(()));
    }

    /// Negative controls: each broken history is caught, by name.
    #[test]
    fn a_value_going_back_or_never_written_is_caught() {
        let back = vec![
            op("a", W, 1, 0),
            op("a", W, 2, 10),
            op("b", R, 2, 20),
            op("b", R, 1, 30),
        ];
        let e = check_sequential("0.0/0", &back, 0).unwrap_err();
        assert!(e.contains("page 0.0/0") && e.contains("b read 1"), "{e}");
        let own = vec![op("a", W, 1, 0), op("a", R, 0, 10)];
        assert!(
            check_sequential("0", &own, 0).is_err(),
            "own write then older"
        );
        let forged = vec![op("a", W, 1, 0), op("b", R, 0xdead, 10)];
        let e = check_sequential("0", &forged, 0).unwrap_err();
        assert!(e.contains("57005") && e.contains("no process wrote"), "{e}");
        // Two readers disagreeing on the order of two writes.
        let split = vec![
            op("a", W, 1, 0),
            op("b", W, 2, 0),
            op("c", R, 1, 10),
            op("c", R, 2, 20),
            op("d", R, 2, 10),
            op("d", R, 1, 20),
        ];
        assert!(check_sequential("0", &split, 0).is_err());
    }

    #[test]
    fn a_pending_write_may_or_may_not_have_happened() {
        let mut w = op("a", W, 7, 5);
        w.end_ns = None;
        assert_eq!(
            check_sequential("0", &[w.clone(), op("b", R, 0, 10)], 0),
            Ok(())
        );
        assert_eq!(check_sequential("0", &[w, op("b", R, 7, 10)], 0), Ok(()));
    }

    #[test]
    fn parses_dsmtool_lines() {
        let ops = parse_dsmtool(
            "a",
            "ready\nT 0 3 10 20\nR 1 0 30 40\nr 0 3\n",
            Some((0, 4, 50)),
        );
        assert_eq!(ops[&0].len(), 2);
        assert_eq!(ops[&0][0].kind, OpKind::Write);
        assert_eq!(ops[&0][1].end_ns, None);
        assert_eq!(ops[&1][0].value, 0);
    }
}
