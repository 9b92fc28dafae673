//! Real programs traced under Valgrind lackey (full run only) and the rows they drive.

use super::*;

/// Ousterhout-style OS microbenchmarks (after Ousterhout, "Why aren't operating systems
/// getting faster as fast as hardware?", 1990), compiled at run time for the captured
/// `ousterhout`: kernel entry, a token passed through pipes between two processes,
/// open-close, a 64 KB file write and read back, create-delete, block copy.
pub(super) const OUSTERHOUT_C: &str = r#"#include <fcntl.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/wait.h>
#include <unistd.h>
int main(int argc, char **argv) {
  int n = argc > 1 ? atoi(argv[1]) : 200;
  static char buf[65536], dst[65536];
  char path[4096];
  snprintf(path, sizeof path, "%s/ousterhout.tmp", argc > 2 ? argv[2] : ".");
  for (int i = 0; i < n; i++) (void)getppid();
  int p1[2], p2[2];
  if (pipe(p1) || pipe(p2)) return 1;
  pid_t c = fork();
  if (c == 0) {
    char t;
    for (int i = 0; i < n; i++) {
      if (read(p1[0], &t, 1) != 1) _exit(1);
      if (write(p2[1], &t, 1) != 1) _exit(1);
    }
    _exit(0);
  }
  char t = 'x';
  for (int i = 0; i < n; i++) {
    if (write(p1[1], &t, 1) != 1) return 1;
    if (read(p2[0], &t, 1) != 1) return 1;
  }
  waitpid(c, 0, 0);
  for (int i = 0; i < n; i++) close(open(path, O_CREAT | O_WRONLY, 0600));
  memset(buf, 'a', sizeof buf);
  for (int i = 0; i < n / 10 + 1; i++) {
    int fd = open(path, O_CREAT | O_TRUNC | O_RDWR, 0600);
    if (write(fd, buf, sizeof buf) != sizeof buf) return 1;
    lseek(fd, 0, SEEK_SET);
    if (read(fd, dst, sizeof dst) != sizeof dst) return 1;
    close(fd);
  }
  for (int i = 0; i < n / 4 + 1; i++) {
    int fd = open(path, O_CREAT | O_TRUNC | O_WRONLY, 0600);
    if (write(fd, buf, 1024) != 1024) return 1;
    close(fd);
    unlink(path);
  }
  for (int i = 0; i < n / 10 + 1; i++) memcpy(dst, buf, sizeof buf);
  return dst[100] == 'a' ? 0 : 1;
}
"#;

/// Table I workloads that are never captured, and why.
pub(super) const NOT_CAPTURED: &str = "jpeg_play, mpeg_play and video_play (display workloads: no X server or decoder \
     under Valgrind here) are never captured: their synthetic stand-ins stand in";

pub(super) fn write_file(path: &Path, text: &str) -> Result<(), String> {
    std::fs::write(path, text).map_err(|e| format!("{}: {e}", path.display()))
}

/// Builds `name`'s inputs in `dir` and captures it; returns what ran and its events.
pub(super) fn capture_one(
    name: &str,
    dir: &Path,
    cfg: &CaptureCfg,
) -> Result<(String, CapturedEvents), String> {
    let d = dir.display().to_string();
    let (what, cmd): (String, Vec<String>) = match name {
        "compress" => {
            let input = dir.join("in.txt");
            let text: String = (0..1500u64)
                .map(|i| {
                    format!(
                        "line {i} of some text {} the quick brown fox\n",
                        i * 7919 % 1000
                    )
                })
                .collect();
            write_file(&input, &text)?;
            (
                "gzip -k of 70 KB of generated text".into(),
                vec![
                    "gzip".into(),
                    "-k".into(),
                    "-f".into(),
                    input.display().to_string(),
                ],
            )
        }
        "IOzone" => {
            let blocks = cfg.iozone_mb * 16;
            (
                format!(
                    "dd: write then read back {} MB in 64 KB blocks",
                    cfg.iozone_mb
                ),
                vec![
                    "sh".into(),
                    "-c".into(),
                    format!(
                        "dd if=/dev/zero of={d}/io.dat bs=64k count={blocks} status=none && \
                         dd if={d}/io.dat of=/dev/null bs=64k status=none && rm -f {d}/io.dat"
                    ),
                ],
            )
        }
        "ousterhout" => {
            let src = dir.join("ousterhout.c");
            let exe = dir.join("ousterhout");
            write_file(&src, OUSTERHOUT_C)?;
            let st = std::process::Command::new("gcc")
                .arg("-O1")
                .arg("-o")
                .arg(&exe)
                .arg(&src)
                .status()
                .map_err(|e| format!("gcc: {e}"))?;
            if !st.success() {
                return Err(format!("gcc {} failed ({st})", src.display()));
            }
            (
                format!(
                    "syscall microbenchmarks ({} iterations; two processes)",
                    cfg.ousterhout_iterations
                ),
                vec![
                    exe.display().to_string(),
                    cfg.ousterhout_iterations.to_string(),
                    d.clone(),
                ],
            )
        }
        "mab" => {
            for i in 1..=3 {
                write_file(
                    &dir.join(format!("f{i}.c")),
                    &format!(
                        "int f{i}(int x) {{ int s = 0; for (int i = 0; i < x; i++) s += i * {i}; return s; }}\n"
                    ),
                )?;
            }
            write_file(
                &dir.join("main.c"),
                "int f1(int); int f2(int); int f3(int);\nint main(void) { return (f1(3) + f2(4) + f3(5)) & 1; }\n",
            )?;
            write_file(
                &dir.join("Makefile"),
                "OBJ = main.o f1.o f2.o f3.o\nprog: $(OBJ)\n\tgcc -o prog $(OBJ)\n%.o: %.c\n\tgcc -O0 -c $<\n",
            )?;
            (
                "make + gcc on a 4-file C tree".into(),
                vec!["make".into(), "-s".into(), "-C".into(), d.clone()],
            )
        }
        other => return Err(format!("{other} cannot be captured")),
    };
    let ev = mmulab_swtlb::workload::capture_events(&dir.join(format!("{name}.mmutrace")), &cmd)
        .map_err(|e| e.to_string())?;
    Ok((what, ev))
}

impl Shape {
    /// [`Shape::run`] over one fixed event stream (a captured trace): the seeds vary the
    /// OS models' and the TLBs' random draws only.
    pub(super) fn run_events(
        &self,
        os: OsKind,
        events: &[Event],
        setups: &[TlbSetup],
        costs: &CostPreset,
    ) -> Result<Vec<Agg>, SpecError> {
        let results: Vec<Vec<Outcome>> = self
            .seeds
            .par_iter()
            .map(|&seed| {
                let s = self.stream(os, events, seed);
                simulate_trap(&s, os, setups, costs, seed, self.real_slots).map(|r| r.0)
            })
            .collect::<Result<_, _>>()
            .map_err(|e| invalid(format!("{}: {e}", self.origin)))?;
        Ok(aggregate(&results, setups.len(), self.seeds.len(), costs))
    }
}

/// The Table I workloads a capture can run.
pub(super) const CAPTURABLE: [&str; 4] = ["compress", "IOzone", "ousterhout", "mab"];

/// The artefacts a captured workload's rows carry.
pub(super) fn captured_artefacts(name: &str) -> Vec<String> {
    let mut v = vec![format!("Tables V-VI (captured {name})")];
    if name == "IOzone" || name == "ousterhout" {
        v.push(format!("Table IX (captured {name})"));
    }
    if name == "ousterhout" {
        v.push(format!("Table VIII (captured {name})"));
    }
    v
}

/// Why a workload is not captured even in the full run (`None`: it is).
pub(super) fn never_captured(cfg: &CaptureCfg, name: &str) -> Option<&'static str> {
    if !cfg.enabled {
        Some(
            "capture disabled in shape.toml ([capture] enabled = false); the stand-in rows stand in",
        )
    } else if cfg.workloads.iter().any(|w| w == name) {
        None
    } else if name == "mab" {
        Some(
            "not in [capture] workloads: make + gcc under lackey takes about 9 minutes on 2 cores (cc1 writes about 100 MB of trace per file); the stand-in rows stand in",
        )
    } else {
        Some("not in [capture] workloads; the stand-in rows stand in")
    }
}

/// The reason every capture the full run makes is missing under `--quick`.
pub const QUICK_SKIPS: &str =
    "captured under Valgrind in the full run only (--quick skips captures)";

/// `--quick`: no capture runs (a capture depends on the machine's programs and libc, and
/// the `--quick` tables must be the same everywhere); each captured artefact is named.
pub(super) fn quick_skips_captures(
    shape: &Shape,
    table: &mut ReproTable,
    progress: &(dyn Fn(&str) + Sync),
) {
    for name in CAPTURABLE {
        let why = never_captured(&shape.capture, name).unwrap_or(QUICK_SKIPS);
        progress(&format!("captured {name}: skipped ({why})"));
        for art in captured_artefacts(name) {
            table.not_reproduced(&art, why);
        }
    }
    table.not_reproduced("Tables V-VI (captured display workloads)", NOT_CAPTURED);
}

/// Table I workloads as traces captured at run time under Valgrind lackey
/// (`[capture]` of shape.toml): `compress` (gzip), `IOzone` (dd write + read), `ousterhout`
/// (syscall microbenchmarks compiled here), `mab` (make + gcc; slow). Their system calls
/// drive the OS models. Each is run on the five OS models (Tables V-VI); `IOzone` and
/// `ousterhout` also through Table IX's partitionings and `ousterhout` through Table
/// VIII's placements. A workload whose capture fails (no Valgrind, no gcc) is named in
/// `not_reproduced`, with why, and its synthetic stand-in's rows stand in. Every row is
/// `emergent`: `dynamic.threshold` was chosen on the stand-ins, not on these traces.
pub(super) fn captured_rows(
    shape: &Shape,
    table: &mut ReproTable,
    progress: &(dyn Fn(&str) + Sync),
) -> Result<(), SpecError> {
    let cfg = &shape.capture;
    for name in CAPTURABLE {
        if let Some(why) = never_captured(cfg, name) {
            progress(&format!("captured {name}: skipped ({why})"));
            for art in captured_artefacts(name) {
                table.not_reproduced(&art, why);
            }
            continue;
        }
        progress(&format!("captured {name}: running under Valgrind lackey"));
        let dir =
            std::env::temp_dir().join(format!("mmulab-uhlig94-{}-{name}", std::process::id()));
        std::fs::create_dir_all(&dir).map_err(|err| SpecError::Io {
            path: dir.display().to_string(),
            err,
        })?;
        let got = capture_one(name, &dir, cfg);
        std::fs::remove_dir_all(&dir).ok();
        let (what, cap) = match got {
            Ok(x) => x,
            Err(e) => {
                progress(&format!(
                    "captured {name}: capture failed ({e}); its synthetic stand-in stands in"
                ));
                for art in captured_artefacts(name) {
                    table.not_reproduced(
                        &art,
                        &format!("not captured: {e}; the stand-in rows stand in"),
                    );
                }
                continue;
            }
        };
        let art = format!("Tables V-VI (captured {name})");
        let workload = format!("{name} (captured)");
        let mut secs = Vec::new();
        for os in OsKind::ALL {
            let costs = shape.costs(os);
            let a = shape
                .run_events(os, &cap.events, &[TlbSetup::default()], &costs)?
                .remove(0);
            let total: f64 = a.counts.iter().sum();
            table.push(with_ci(
                ReproRow::plot_only(
                    &art,
                    "TLB time",
                    None,
                    a.seconds,
                    &format!(
                        "captured: {what}; {} refs, {} system calls, {} processes; {:.0} misses, L1U {:.1}%",
                        cap.refs,
                        cap.syscalls,
                        cap.processes,
                        total,
                        a.counts[0] / total.max(1.0) * 100.0
                    ),
                )
                .unit("s")
                .at("os", os.name())
                .at("workload", workload.as_str())
                .emergent(),
                a.ci(|s| s.seconds).1,
            ));
            secs.push(a.seconds);
        }
        table.push(
            ReproRow::claim(
                &art,
                "TLB time ordering",
                Some(secs[2] / secs[0]),
                secs[0] < secs[1] && secs[1] < secs[2],
                &format!(
                    "Ultrix < OSF/1 < Mach3 on a real program's references and system calls ({:.4} < {:.4} < {:.4}; Mach3 / Ultrix shown)",
                    secs[0], secs[1], secs[2]
                ),
            )
            .unit("ratio")
            .at("workload", workload.as_str())
            .emergent(),
        );
        if cap.syscalls > 0 && name != "compress" {
            table.push(
                ReproRow::claim(
                    &art,
                    "Mach3 < AFSin < AFSout",
                    Some(secs[4] / secs[2]),
                    secs[2] < secs[3] && secs[3] < secs[4],
                    "its file calls reach the AFS cache manager: in the Unix server (AFSin), then in a task of its own (AFSout); AFSout / Mach3 shown",
                )
                .unit("ratio")
                .at("workload", workload.as_str())
                .emergent(),
            );
        }
        // Fig. 5 on the captured trace: where L2 misses stop. The application's share of
        // the live L2 PTEs is whatever 4 MB regions the captured processes touched (not a
        // model constant); the kernel's two and each server's three are still the model's
        // layout, so the knees are shown, not judged.
        {
            let mut regions: Vec<(u16, u64)> = cap
                .events
                .iter()
                .filter_map(|e| match e {
                    Event::Ref { task, r } => Some((*task, r.vpn() >> 10)),
                    _ => None,
                })
                .collect();
            regions.sort_unstable();
            regions.dedup();
            let lowers: Vec<usize> = (2..=24).collect();
            let setups: Vec<TlbSetup> = lowers.iter().map(|&l| setup_at(l, Placement::A)).collect();
            for os in [OsKind::Osf1, OsKind::Mach3, OsKind::Mach3AfsOut] {
                let r = shape.run_events(os, &cap.events, &setups, &shape.costs(os))?;
                let l2: Vec<f64> = r
                    .iter()
                    .map(|a| a.secs_by_type[MissType::L2.index()])
                    .collect();
                let knee = l2_knee(&lowers, &l2, 24);
                table.push(
                    ReproRow::plot_only(
                        "Fig. 5",
                        "knee",
                        None,
                        knee as f64,
                        &format!(
                            "captured: first partition (2-24) with L2 time <= 5% of its largest; the captured processes touch {} distinct 4 MB regions (their L2 PTEs, from the trace), plus the kernel's 2 and 3 per server task from the layout (layout.rs); not judged (the paper's knees are mab's, which is not captured by default)",
                            regions.len()
                        ),
                    )
                    .unit("lower slots")
                    .at("os", os.name())
                    .at("workload", workload.as_str())
                    .emergent(),
                );
            }
        }
        if name == "ousterhout" || name == "IOzone" {
            let lowers: Vec<usize> = (2..=40).step_by(2).collect();
            let mut setups: Vec<TlbSetup> =
                lowers.iter().map(|&l| setup_at(l, Placement::B)).collect();
            setups.push(TlbSetup {
                lower: 8,
                placement: Placement::B,
                dynamic: Some(shape.dynamic.clone()),
                ..TlbSetup::default()
            });
            let r = shape.run_events(
                OsKind::Mach3,
                &cap.events,
                &setups,
                &shape.costs(OsKind::Mach3),
            )?;
            table9_rows(
                table,
                &Table9 {
                    art: format!("Table IX (captured {name})"),
                    dynamic_fitted: false,
                    live_lower: None,
                    workload: workload.clone(),
                    note: format!("captured: {what}"),
                },
                &r,
                &lowers,
                &shape.paper().sub("table9")?.nums(name)?,
                shape.paper().num("optimum_tolerance_pct")?,
            );
        }
        if name == "ousterhout" {
            let pol = [Placement::A, Placement::B, Placement::C, Placement::D];
            let costs = shape.costs(OsKind::Mach3);
            let r = shape.run_events(
                OsKind::Mach3,
                &cap.events,
                &pol.map(|p| setup_at(8, p)),
                &costs,
            )?;
            table8_rows(
                table,
                "Table VIII (captured ousterhout)",
                &workload,
                &r,
                &costs,
                &format!("captured: {what}"),
                shape,
            )?;
        }
    }
    table.not_reproduced("Tables V-VI (captured display workloads)", NOT_CAPTURED);
    Ok(())
}
