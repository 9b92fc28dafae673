#!/usr/bin/env python3
"""Interleaved `mmulab bench` runs of two (or more) binaries, for before/after
figures on a shared machine (docs/speed.md).

usage: scripts/bench-interleaved.py ROUNDS NAME=BINARY... -- [bench options]
       scripts/bench-interleaved.py ROUNDS NAME=BINARY... --cmd [--work N] -- ARGS...

The second form times any command, `BINARY ARGS...` (`run experiments/tester.toml
--set machine.cpus=1024 -q`, `trace sim FILE --entries 16,32`), interleaved the
same way, and prints each binary's median and range of CPU seconds (user +
system), and with `--work N` also N over the CPU seconds in millions per
second (N: the references, or configuration-references, the command does).

Each round runs `BINARY bench --runs 1 --json [bench options]` once per
binary, the order alternating between rounds. Per run: bench's own wall rate,
and the CPU rate, the run's references (`--refs-per-thread` times 16 threads,
the bench workload's, as `mmulab run` counts them for the default workload)
over the child's user + system time (process start included). Prints the
median and range of each.

Binaries whose runs make different numbers of references (a binary from
before session 33's fix of the bench workload makes 31,686,656 at the
foundation's defaults, one after it 32,000,000) take their own count as
NAME=BINARY@REFS; the others use MMULAB_BENCH_REFS or the default."""
import json, os, resource, statistics, subprocess, sys

def main():
    rounds = int(sys.argv[1])
    rest = sys.argv[2:]
    split = rest.index('--') if '--' in rest else len(rest)
    head = rest[:split]
    args = rest[split + 1:]
    if '--cmd' in head:
        i = head.index('--cmd')
        work = None
        tail = head[i + 1:]
        if tail[:1] == ['--work']:
            work = float(tail[1])
        bins = dict(a.split('=', 1) for a in head[:i])
        return cmd_mode(rounds, bins, args, work)
    bins = dict(a.split('=', 1) for a in head)
    own = {}
    for k, v in bins.items():
        if '@' in v:
            bins[k], n = v.rsplit('@', 1)
            own[k] = int(n)
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
            res[k]['cpu'].append(own.get(k, refs) / cpu / 1e6)
    for k in bins:
        for m in ('wall', 'cpu'):
            v = res[k][m]
            print(f"{k} {m:4}: median {statistics.median(v):6.1f} M/s  "
                  f"range {min(v):6.1f}-{max(v):6.1f}  ({len(v)} runs)")

def cmd_mode(rounds, bins, args, work):
    res = {k: [] for k in bins}
    outs = {}
    for r in range(rounds):
        order = list(bins) if r % 2 == 0 else list(bins)[::-1]
        for k in order:
            before = resource.getrusage(resource.RUSAGE_CHILDREN)
            p = subprocess.run([bins[k]] + args, capture_output=True, text=True)
            after = resource.getrusage(resource.RUSAGE_CHILDREN)
            if p.returncode not in (0, 1):
                sys.exit(f"{k}: exit {p.returncode}: {p.stderr.strip()}")
            res[k].append((after.ru_utime - before.ru_utime) + (after.ru_stime - before.ru_stime))
            outs.setdefault(k, p.stdout)
    for k in bins:
        v = res[k]
        line = (f"{k} cpu s: median {statistics.median(v):8.3f}  "
                f"range {min(v):8.3f}-{max(v):8.3f}  ({len(v)} runs)")
        if work:
            line += f"  = {work / statistics.median(v) / 1e6:8.1f} M/s"
        print(line)
    first = list(bins)[0]
    for k in bins:
        if k != first and outs[k] != outs[first]:
            print(f"note: {k}'s output differs from {first}'s (timings in it?)")

if __name__ == '__main__':
    main()
