//! `run_shootdown`: the baseline and one point per responder count.

use std::sync::atomic::AtomicBool;

use crate::error::HostError;
use crate::options::{Op, ShootdownOptions};
use crate::report::HostReport;

/// What a long run reports as it goes, so that the binary can draw a
/// progress bar. Delivered on the calling thread, between repetitions
/// (never inside a timed window).
#[derive(Clone, Debug, PartialEq)]
pub enum Progress {
    /// Once, first: the whole run's repetitions (warm-up included).
    Plan { points: usize, total_reps: u64 },
    /// A point begins; `threads` is 0 for the baseline.
    Point { threads: usize, op: Op, reps: usize },
    /// One more repetition done (`done` counts the whole run).
    Rep { done: u64, total: u64 },
    /// Something the user should know (also kept in `HostReport::notes`).
    Note(String),
}

/// Runs black89's tester: the baseline, then each responder count of
/// `opts.threads` that fits this machine.
pub fn run_shootdown(
    opts: &ShootdownOptions,
    progress: &mut dyn FnMut(Progress),
) -> Result<HostReport, HostError> {
    run_shootdown_until(opts, progress, None)
}

/// [`run_shootdown`], stopped when `stop` is raised (Ctrl-C): checked
/// before every repetition; the point in progress is dropped (a point is
/// all its repetitions or none) and no further point starts. The report
/// holds the points measured; stopped before the baseline was, it is
/// [`HostError::Interrupted`].
pub fn run_shootdown_until(
    opts: &ShootdownOptions,
    progress: &mut dyn FnMut(Progress),
    stop: Option<&AtomicBool>,
) -> Result<HostReport, HostError> {
    opts.validate()?;
    #[cfg(target_os = "linux")]
    {
        linux::run(opts, progress, stop)
    }
    #[cfg(not(target_os = "linux"))]
    {
        let _ = (progress, stop);
        Err(HostError::Unsupported {
            os: std::env::consts::OS,
        })
    }
}

/// The counts of `requested` that fit `usable_cores` (one for the
/// initiator), and the note saying what did not.
pub fn fit_threads(requested: &[usize], usable_cpus: &[usize]) -> (Vec<usize>, Option<String>) {
    let max = usable_cpus.len().saturating_sub(1);
    let (fit, skipped): (Vec<usize>, Vec<usize>) = requested.iter().partition(|t| **t <= max);
    if skipped.is_empty() {
        return (fit, None);
    }
    let cpus = usable_cpus
        .iter()
        .map(|c| c.to_string())
        .collect::<Vec<_>>()
        .join(",");
    let skipped_s = skipped
        .iter()
        .map(|t| t.to_string())
        .collect::<Vec<_>>()
        .join(", ");
    let measured = if fit.is_empty() {
        "only the baseline".to_string()
    } else {
        format!(
            "measuring {}",
            fit.iter()
                .map(|t| t.to_string())
                .collect::<Vec<_>>()
                .join(", ")
        )
    };
    let note = format!(
        "more threads than cores: this process may use {} core{} (CPU {cpus}); the initiator takes one, so at most {max} responder{} fit, one per core. Skipping {skipped_s}; {measured}",
        usable_cpus.len(),
        if usable_cpus.len() == 1 { "" } else { "s" },
        if max == 1 { "" } else { "s" },
    );
    (fit, Some(note))
}

#[cfg(target_os = "linux")]
mod linux {
    use super::*;
    use crate::environment::{Environment, Known};
    use crate::interrupts::NO_TLB_LINE;
    use crate::report::{Point, fit_points};
    use crate::tester::{Tester, TesterConfig, usable_cpus};
    use std::sync::atomic::Ordering;

    pub(super) fn run(
        opts: &ShootdownOptions,
        progress: &mut dyn FnMut(Progress),
        stop: Option<&AtomicBool>,
    ) -> Result<HostReport, HostError> {
        let stopped = || stop.is_some_and(|s| s.load(Ordering::Relaxed));
        let environment = Environment::detect();
        let cpus = usable_cpus()?;
        let mut notes = Vec::new();
        let mut note = |n: String, progress: &mut dyn FnMut(Progress)| {
            progress(Progress::Note(n.clone()));
            notes.push(n);
        };
        let requested = if opts.threads.is_empty() {
            ShootdownOptions::default_threads(cpus.len())
        } else {
            opts.threads.clone()
        };
        let (threads, skipped) = fit_threads(&requested, &cpus);
        let per_point = (opts.warmup + opts.reps) as u64;
        let total = per_point * (threads.len() as u64 + 1);
        progress(Progress::Plan {
            points: threads.len() + 1,
            total_reps: total,
        });
        if let Some(n) = skipped {
            note(n, progress);
        }
        let count_tlb = environment.tlb_interrupt_line.value == Known::Yes;
        if !count_tlb {
            note(
                format!("{NO_TLB_LINE} ({})", environment.tlb_interrupt_line.detail),
                progress,
            );
        }
        if environment.pv_tlb_flush.value == Known::Yes {
            note(
                "paravirtual TLB flush is on: a responder whose vCPU the host has preempted gets no IPI (the host flushes it before it runs again), so a point may count fewer TLB interrupts than reps × responders".into(),
                progress,
            );
        }
        let mut done = 0u64;
        let mut measure = |responders: usize,
                           progress: &mut dyn FnMut(Progress)|
         -> Result<Option<Point>, HostError> {
            progress(Progress::Point {
                threads: responders,
                op: opts.op,
                reps: opts.reps,
            });
            let mut tester = Tester::new(TesterConfig {
                op: opts.op,
                pages: opts.pages,
                cpus: cpus[..=responders].to_vec(),
                ack_timeout: opts.ack_timeout,
                fault_timeout: opts.fault_timeout,
                hooks: opts.hooks,
                count_tlb_interrupts: count_tlb,
            })?;
            let mut outcomes = Vec::with_capacity(opts.reps);
            for i in 0..opts.warmup + opts.reps {
                if stopped() {
                    return Ok(None);
                }
                let o = tester.rep()?;
                if i >= opts.warmup {
                    outcomes.push(o);
                }
                done += 1;
                progress(Progress::Rep { done, total });
            }
            drop(tester);
            Ok(Some(Point::from_outcomes(
                responders, opts.op, opts.pages, &outcomes,
            )))
        };
        // The baseline first, before any responder thread has ever run on
        // another core of this address space.
        let baseline = measure(0, progress)?.ok_or(HostError::Interrupted)?;
        let mut points = Vec::with_capacity(threads.len());
        for &t in &threads {
            match measure(t, progress)? {
                Some(p) => points.push(p),
                None => break,
            }
        }
        let missed: usize = points.iter().map(|p| p.missed_faults).sum();
        if missed > 0 {
            note(
                format!(
                    "{missed} responder fault(s) did not come within {:?} of the operation: those responders were not running (descheduled) when it happened, so they were not shot at; rerun on a quieter machine",
                    opts.fault_timeout
                ),
                progress,
            );
        }
        let fit = fit_points(&points, &baseline);
        if points.len() == 1 {
            note(
                "one responder count only: the fit is the line through the baseline and that point (exact there, an extrapolation elsewhere)".into(),
                progress,
            );
        }
        Ok(HostReport {
            points,
            baseline,
            fit,
            environment,
            notes,
        })
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn more_threads_than_cores_runs_what_fits_and_says_so() {
        let (fit, note) = fit_threads(&[1, 2, 4], &[0, 1]);
        assert_eq!(fit, vec![1]);
        let note = note.unwrap();
        for want in [
            "2 cores",
            "CPU 0,1",
            "at most 1 responder",
            "Skipping 2, 4",
            "measuring 1",
        ] {
            assert!(note.contains(want), "{note}");
        }
        let (fit, note) = fit_threads(&[1], &[3]);
        assert!(fit.is_empty());
        assert!(note.unwrap().contains("only the baseline"));
        assert_eq!(
            fit_threads(&[1, 2, 3], &[0, 1, 2, 3]),
            (vec![1, 2, 3], None)
        );
    }

    #[cfg(not(target_os = "linux"))]
    #[test]
    fn non_linux_says_so() {
        let e = run_shootdown(&ShootdownOptions::default(), &mut |_| {}).unwrap_err();
        assert!(e.to_string().contains("only on Linux"));
    }
}
