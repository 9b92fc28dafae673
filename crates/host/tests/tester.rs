//! The tester on real threads. No timings are asserted, only verdicts,
//! notes and shapes. Two cores are enough (one initiator, one responder);
//! with one core only the baseline runs and the responder assertions are
//! skipped.
#![cfg(target_os = "linux")]

use mmulab_host::tester::usable_cpus;
use mmulab_host::{
    Hooks, Known, Op, Progress, ShootdownOptions, Verdict, format_report, run_shootdown,
};
use std::time::Duration;

fn usable() -> usize {
    usable_cpus().unwrap().len()
}

/// Small and patient: CI machines are shared and busy.
fn quick(op: Op) -> ShootdownOptions {
    ShootdownOptions {
        threads: vec![1],
        op,
        pages: 1,
        reps: 4,
        warmup: 1,
        ack_timeout: Duration::from_secs(20),
        fault_timeout: Duration::from_secs(2),
        hooks: Hooks::default(),
    }
}

#[test]
fn every_operation_is_consistent_with_one_responder() {
    for op in Op::ALL {
        for pages in [1, 3] {
            let mut seen = Vec::new();
            let r = run_shootdown(&ShootdownOptions { pages, ..quick(op) }, &mut |p| {
                seen.push(p)
            })
            .unwrap();
            assert_eq!(r.baseline.threads, 0);
            assert_eq!(
                r.baseline.verdict,
                Verdict::Consistent,
                "{op} baseline: {:?}",
                r.baseline.violations
            );
            assert_eq!(r.points.len(), usize::from(usable() >= 2));
            for p in &r.points {
                assert_eq!(
                    p.verdict,
                    Verdict::Consistent,
                    "{op} {pages}p: {:?}",
                    p.violations
                );
                assert_eq!((p.op, p.pages, p.reps), (op, pages, 4));
                if r.environment.tlb_interrupt_line.value == Known::Yes {
                    assert!(p.tlb_interrupts.is_some());
                }
            }
            // Progress: the plan first, then every repetition counted.
            let Progress::Plan { total_reps, .. } = seen[0] else {
                panic!("no plan first: {seen:?}")
            };
            let reps = seen
                .iter()
                .filter(|p| matches!(p, Progress::Rep { .. }))
                .count() as u64;
            assert_eq!(reps, total_reps);
            let table = format_report(&r);
            assert!(
                table.contains(op.name()) && table.contains("430 µs + 55 µs"),
                "{table}"
            );
        }
    }
}

#[test]
fn skipping_the_operation_is_caught() {
    // The negative control: an "operation" that changes nothing. Responders
    // keep writing (mprotect, munmap) or the page keeps its contents
    // (madvise): the verdict must say inconsistent.
    if usable() < 2 {
        eprintln!("one usable core: no responder, nothing to catch");
        return;
    }
    for op in Op::ALL {
        let opts = ShootdownOptions {
            reps: 2,
            fault_timeout: Duration::from_millis(300),
            hooks: Hooks {
                skip_operation: true,
                ..Hooks::default()
            },
            ..quick(op)
        };
        let r = run_shootdown(&opts, &mut |_| {}).unwrap();
        let p = &r.points[0];
        assert_eq!(
            p.verdict,
            Verdict::Inconsistent,
            "{op}: the check did not fire"
        );
        assert!(!p.violations.is_empty());
        assert!(format_report(&r).contains("inconsistent"));
        if op == Op::MadviseDontneed {
            // Even alone, a page that was not discarded is caught.
            assert_eq!(r.baseline.verdict, Verdict::Inconsistent);
        }
    }
}

#[test]
fn a_store_after_the_operation_is_caught() {
    if usable() < 2 {
        eprintln!("one usable core: no responder, nothing to catch");
        return;
    }
    for op in Op::ALL {
        let opts = ShootdownOptions {
            reps: 2,
            hooks: Hooks {
                write_after_operation: true,
                ..Hooks::default()
            },
            ..quick(op)
        };
        let r = run_shootdown(&opts, &mut |_| {}).unwrap();
        let p = &r.points[0];
        assert_eq!(
            p.verdict,
            Verdict::Inconsistent,
            "{op}: the check did not fire"
        );
        assert_eq!(p.inconsistent_reps, 2, "{op}: {:?}", p.violations);
    }
}

#[test]
fn more_threads_than_cores_runs_what_fits_and_says_so() {
    let n = usable();
    let opts = ShootdownOptions {
        threads: vec![n],
        ..quick(Op::Mprotect)
    };
    let mut notes = Vec::new();
    let r = run_shootdown(&opts, &mut |p| {
        if let Progress::Note(n) = p {
            notes.push(n)
        }
    })
    .unwrap();
    assert!(r.points.is_empty());
    assert!(r.fit.is_none());
    let note = r
        .notes
        .iter()
        .find(|m| m.contains("more threads than cores"))
        .expect("a note");
    assert!(note.contains(&format!("{n} core")), "{note}");
    assert!(notes.contains(note), "the note also went through Progress");
}

#[test]
fn options_are_checked_before_anything_runs() {
    for bad in [
        ShootdownOptions {
            pages: 0,
            ..quick(Op::Mprotect)
        },
        ShootdownOptions {
            reps: 0,
            ..quick(Op::Mprotect)
        },
        ShootdownOptions {
            threads: vec![0, 1],
            ..quick(Op::Mprotect)
        },
    ] {
        assert!(run_shootdown(&bad, &mut |_| {}).is_err());
    }
}

/// The SIGSEGV handler must only ever catch responders' faults on the
/// tester's pages; every other fault goes on to the previous handler. Run in
/// a child process (this test binary again), which must die as it would
/// have without the tester.
#[test]
fn faults_elsewhere_still_behave_as_without_the_tester() {
    const HELPER: &str = "MMULAB_HOST_FAULT_HELPER";
    if let Ok(mode) = std::env::var(HELPER) {
        // Install the handler by running a tiny tester first.
        let opts = ShootdownOptions {
            threads: vec![],
            reps: 1,
            warmup: 0,
            ..quick(Op::Mprotect)
        };
        run_shootdown(&opts, &mut |_| {}).unwrap();
        match mode.as_str() {
            "wild-store" => unsafe {
                std::ptr::write_volatile(std::ptr::without_provenance_mut::<u64>(16), 1)
            },
            "stack-overflow" => {
                fn deep(n: u64) -> u64 {
                    let a = [n; 512];
                    if n == u64::MAX {
                        return 0;
                    }
                    deep(std::hint::black_box(n + 1)) + std::hint::black_box(&a)[7]
                }
                let t = std::thread::spawn(|| deep(0));
                let _ = t.join();
            }
            _ => unreachable!(),
        }
        unreachable!("the fault did not kill the process");
    }
    use std::os::unix::process::ExitStatusExt;
    let run = |mode: &str| {
        std::process::Command::new(std::env::current_exe().unwrap())
            .args([
                "--exact",
                "faults_elsewhere_still_behave_as_without_the_tester",
                "--nocapture",
            ])
            .env(HELPER, mode)
            .output()
            .unwrap()
    };
    let out = run("wild-store");
    assert_eq!(
        out.status.signal(),
        Some(nix::libc::SIGSEGV),
        "wild store: {:?}",
        out.status
    );
    let out = run("stack-overflow");
    let stderr = String::from_utf8_lossy(&out.stderr);
    assert!(
        stderr.contains("has overflowed its stack"),
        "std's guard-page handler was not reached: {stderr}"
    );
    assert_eq!(
        out.status.signal(),
        Some(nix::libc::SIGABRT),
        "{:?}",
        out.status
    );
}

#[test]
fn the_environment_of_this_machine_is_recorded_with_evidence() {
    let e = mmulab_host::Environment::detect();
    assert_eq!(e.os, "linux");
    assert!(e.kernel.starts_with("Linux "), "{}", e.kernel);
    assert_eq!(e.usable_cores, Some(usable()));
    for f in [
        &e.hypervisor,
        &e.pv_tlb_flush,
        &e.pti,
        &e.invlpgb,
        &e.tlb_interrupt_line,
    ] {
        assert!(!f.detail.is_empty(), "a fact without evidence: {e:?}");
    }
    if e.hypervisor.value == Known::No {
        assert_eq!(e.pv_tlb_flush.value, Known::No);
    }
    let j = serde_json::to_value(&e).unwrap();
    assert!(["yes", "no", "unknown"].contains(&j["pti"]["value"].as_str().unwrap()));
}
