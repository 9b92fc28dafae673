#!/usr/bin/env python3
"""Host instructions per simulated reference, counted by valgrind, for
`mmulab bench`'s workloads: a figure that does not move with the machine's
load, beside the timings of scripts/bench-interleaved.py (docs/speed.md).

usage: scripts/instructions-per-ref.py [--refs N] NAME=BINARY...

For each binary and each workload (foundation and unitd, at a word and at a
line stride) it runs `BINARY bench --runs 1 --refs-per-thread R` under
`valgrind --tool=cachegrind --cache-sim=no` at R = N and R = 2N (default
N = 250,000, past the first touch of every page the workload uses), and
prints the difference in instructions over the 16 * N references it adds:
the marginal cost of a reference, without process start, set-up, page
faults and report. Same binary, same count, every time.

A count is not a time: at a few instructions per cycle, an instruction
off the critical path can go for free, and a host cache miss costs
hundreds. Compare counts to see what a change removed; time it (paired,
interleaved) to see whether that mattered."""
import re, shutil, subprocess, sys

WORKLOADS = [
    ("foundation, word stride", ["--workload", "foundation", "--stride", "8"]),
    ("foundation, line stride", ["--workload", "foundation", "--stride", "64"]),
    ("unitd, word stride", ["--workload", "unitd", "--stride", "8"]),
    ("unitd, line stride", ["--workload", "unitd", "--stride", "64"]),
]
THREADS = 16  # the bench workload's threads (crates/experiment/src/bench.rs)


def instructions(binary, args, refs):
    cmd = ["valgrind", "--tool=cachegrind", "--cache-sim=no",
           "--cachegrind-out-file=/dev/null", binary, "bench", "--runs", "1",
           "--refs-per-thread", str(refs), "-q"] + args
    p = subprocess.run(cmd, capture_output=True, text=True)
    if p.returncode != 0:
        sys.exit(f"{' '.join(cmd)}: exit {p.returncode}\n{p.stderr[-2000:]}")
    m = re.search(r"I\s+refs:\s+([\d,]+)", p.stderr)
    if not m:
        sys.exit(f"{' '.join(cmd)}: no instruction count in valgrind's report")
    return int(m.group(1).replace(",", ""))


def main():
    argv = sys.argv[1:]
    n = 250_000
    if argv[:1] == ["--refs"]:
        if len(argv) < 2 or not argv[1].isdigit() or int(argv[1]) == 0:
            sys.exit("--refs: a positive number of references per thread")
        n, argv = int(argv[1]), argv[2:]
    bins = [a.split("=", 1) for a in argv]
    if not bins or any(len(b) != 2 or not b[1] for b in bins):
        sys.exit(__doc__)
    if shutil.which("valgrind") is None:
        sys.exit("valgrind is not installed (apt-get install valgrind)")
    print(f"instructions per simulated reference (valgrind; the difference "
          f"between --refs-per-thread {n} and {2 * n})")
    for label, args in WORKLOADS:
        row = []
        for name, binary in bins:
            small = instructions(binary, args, n)
            large = instructions(binary, args, 2 * n)
            row.append(f"{name} {(large - small) / (THREADS * n):8.1f}")
        ratio = ""
        if len(bins) == 2:
            a = float(row[0].split()[-1])
            b = float(row[1].split()[-1])
            ratio = f"  ({bins[0][0]}/{bins[1][0]} = {a / b:.3f})"
        print(f"{label:26} " + "   ".join(row) + ratio)


if __name__ == "__main__":
    main()
