#!/usr/bin/env python3
"""dist.all_reduce through torch.distributed: backend plexus vs gloo, side by side.

    build/bench/plexus-bench-torch [--nprocs 2,4] [--runs 5] [--json]   (a wrapper setting PYTHONPATH)

Both process groups live in the same processes (plexus is the default group, gloo a new_group
over the same ranks); for each size (1 KiB..64 MiB of float32) the two alternate run by run.
A run times `iters` back-to-back all_reduce calls; its time is the slowest rank's mean per call;
each figure is the median of `--runs` runs. busbw = bytes / time * 2(n-1)/n (nccl-tests).
Target (issue 15): plexus busbw >= 1.2x gloo's from 1 MiB up.
"""

import argparse
import os
import sys
import time


import torch  # noqa: E402
import torch.distributed as dist  # noqa: E402

import plexus_torch  # noqa: E402,F401
from plexus_torch import _bench  # noqa: E402

BENCH = "torch"


def worker(rank, world, init_method, sizes, runs):
    _bench.pin_threads()
    dist.init_process_group("plexus", init_method=init_method, rank=rank, world_size=world)
    groups = {"plexus": dist.group.WORLD, "gloo": dist.new_group(backend="gloo")}
    transport = dist.distributed_c10d._get_default_group().transport
    out = []
    for nbytes in sizes:
        t = torch.zeros(nbytes // 4, dtype=torch.float32)
        iters = max(3, min(200, (16 << 20) // nbytes))
        times = {impl: [] for impl in groups}
        for impl, g in groups.items():  # warm-up: connections, buffers, algorithm choice
            for _ in range(2):
                dist.all_reduce(t, group=g)
        for run in range(runs):
            order = list(groups) if run % 2 == 0 else list(reversed(list(groups)))
            for impl in order:
                g = groups[impl]
                dist.barrier(group=g)
                start = time.perf_counter()
                for _ in range(iters):
                    dist.all_reduce(t, group=g)
                per_call = (time.perf_counter() - start) / iters
                slowest = torch.tensor([per_call], dtype=torch.float64)
                dist.all_reduce(slowest, op=dist.ReduceOp.MAX, group=groups["gloo"])
                times[impl].append(slowest.item())
        out.append((nbytes, iters, times))
    dist.barrier()
    dist.destroy_process_group()
    return {"transport": transport, "points": out}


def main():
    p = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    p.add_argument("--nprocs", default="2,4", help="comma-separated process counts")
    p.add_argument("--runs", type=int, default=5)
    p.add_argument("--min-bytes", type=int, default=1 << 10)
    p.add_argument("--max-bytes", type=int, default=64 << 20)
    p.add_argument("--json", action="store_true", help="one JSON line per figure")
    a = p.parse_args()
    nprocs = [int(x) for x in a.nprocs.split(",")]
    if min(nprocs) < 2 or a.runs < 1 or a.min_bytes < 4 or a.max_bytes < a.min_bytes:
        p.error("need --nprocs >= 2, --runs >= 1, 4 <= --min-bytes <= --max-bytes")
    sizes = []
    s = a.min_bytes
    while s <= a.max_bytes:
        sizes.append(s)
        s *= 4
    for n in nprocs:
        report(n, a, _bench.spawn(worker, n, sizes, a.runs))
    return 0


def report(nprocs, a, res):
    factor = 2 * (nprocs - 1) / nprocs
    rows = []
    for nbytes, iters, times in res["points"]:
        busbw = {}
        for impl, ts in times.items():
            med = _bench.median(ts)
            busbw[impl] = nbytes / med * factor / 1e9
            rows.append(_bench.figure(
                BENCH, "allreduce busbw", busbw[impl], "GB/s", impl=impl,
                transport=res["transport"] if impl == "plexus" else "tcp", nprocs=nprocs,
                bytes=nbytes, dtype="float32", time_us=med * 1e6, time_us_min=min(ts) * 1e6,
                time_us_max=max(ts) * 1e6, runs=len(ts), iters=iters))
        ratio = busbw["plexus"] / busbw["gloo"]
        target = 1.2 if nbytes >= (1 << 20) else None
        rows.append(_bench.figure(BENCH, "allreduce busbw plexus/gloo", ratio, "ratio", target=target,
                                  met=(ratio >= target) if target else None, nprocs=nprocs,
                                  bytes=nbytes))
    if a.json:
        for r in rows:
            print(_bench.figure_line(r), flush=True)
        return
    print(f"torch.distributed all_reduce, {nprocs} processes, median of {a.runs} runs "
          f"(plexus over {res['transport']})")
    print(f"{'bytes':>10} {'plexus us':>10} {'gloo us':>10} {'plexus GB/s':>12} {'gloo GB/s':>10} {'ratio':>6}  target")
    by = {}
    for r in rows:
        by.setdefault(r["bytes"], {})[r.get("impl", "ratio")] = r
    for nbytes, d in by.items():
        ratio = d["ratio"]
        tgt = "" if "target" not in ratio else f">= {ratio['target']} {'met' if ratio['met'] else 'MISSED'}"
        print(f"{nbytes:>10} {d['plexus']['time_us']:>10.1f} {d['gloo']['time_us']:>10.1f} "
              f"{d['plexus']['value']:>12.3f} {d['gloo']['value']:>10.3f} {ratio['value']:>6.2f}  {tgt}", flush=True)

if __name__ == "__main__":
    sys.exit(main())
