#!/usr/bin/env python3
"""Interleaved `mmulab bench` runs of two (or more) binaries, for before/after
figures on a shared machine (docs/speed.md).

usage: scripts/bench-interleaved.py ROUNDS NAME=BINARY... -- [bench options]

Each round runs `BINARY bench --runs 1 --json [bench options]` once per
binary, the order alternating between rounds. Per run: bench's own wall rate,
and the CPU rate, the run's references (`--refs-per-thread` times 16 threads,
the bench workload's, as `mmulab run` counts them for the default workload)
over the child's user + system time (process start included). Prints the
median and range of each."""
import json, os, resource, statistics, subprocess, sys

def main():
    rounds = int(sys.argv[1])
    rest = sys.argv[2:]
    split = rest.index('--') if '--' in rest else len(rest)
    bins = dict(a.split('=', 1) for a in rest[:split])
    args = rest[split + 1:]
    per_thread = 2_000_000
    if '--refs-per-thread' in args:
        per_thread = int(args[args.index('--refs-per-thread') + 1])
    # 16 threads; the workload rounds each thread's count to whole batches,
    # so the exact count (`counters.refs` of `mmulab run` on the same spec)
    # can be given as MMULAB_BENCH_REFS.
    refs = int(os.environ.get('MMULAB_BENCH_REFS', 16 * per_thread))
    res = {k: {'wall': [], 'cpu': []} for k in bins}
    for r in range(rounds):
        order = list(bins) if r % 2 == 0 else list(bins)[::-1]
        for k in order:
            before = resource.getrusage(resource.RUSAGE_CHILDREN)
            out = subprocess.run([bins[k], 'bench', '--runs', '1', '--json'] + args,
                                 capture_output=True, text=True, check=True).stdout
            after = resource.getrusage(resource.RUSAGE_CHILDREN)
            cpu = (after.ru_utime - before.ru_utime) + (after.ru_stime - before.ru_stime)
            res[k]['wall'].append(json.loads(out)['refs_per_second'] / 1e6)
            res[k]['cpu'].append(refs / cpu / 1e6)
    for k in bins:
        for m in ('wall', 'cpu'):
            v = res[k][m]
            print(f"{k} {m:4}: median {statistics.median(v):6.1f} M/s  "
                  f"range {min(v):6.1f}-{max(v):6.1f}  ({len(v)} runs)")

if __name__ == '__main__':
    main()
