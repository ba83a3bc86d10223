#!/usr/bin/env python3
"""dist.all_reduce through torch.distributed: backend plexus vs gloo, side by side.

    build/bench/plexus-bench-torch [--nprocs 2,4] [--runs 5] [--json]   (a wrapper setting PYTHONPATH)

The process groups live in the same processes (plexus is the default group, the others
new_groups over the same ranks); for each size (1 KiB..64 MiB of float32) they alternate run by run.
A run times `iters` back-to-back all_reduce calls; its time is the slowest rank's mean per call;
each figure is the median of `--runs` runs, the groups launched in a balanced order; after each
run one all_reduce per group is checked (the exit code is 1 when any was wrong). busbw = bytes /
time * 2(n-1)/n (nccl-tests). Groups: plexus as a user gets it (shm on one host), plexus_tcp
(tcp under the system's congestion control, as Gloo: like with like) and gloo. Target: plexus_tcp
busbw >= 1.2x gloo's from 1 MiB up.
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
    # Like with like: "plexus" as a user gets it (shm on one host), "plexus_tcp" over tcp under
    # the system's congestion control, as Gloo runs.
    os.environ["PLEXUS_TORCH_TRANSPORT"] = "tcp"
    os.environ["PLEXUS_TORCH_LOOPBACK_CC"] = "system"
    plexus_tcp = dist.new_group(backend="plexus")
    del os.environ["PLEXUS_TORCH_TRANSPORT"], os.environ["PLEXUS_TORCH_LOOPBACK_CC"]
    groups = {"plexus": dist.group.WORLD, "plexus_tcp": plexus_tcp,
              "gloo": dist.new_group(backend="gloo")}
    transport = dist.distributed_c10d._get_default_group().transport
    out = []
    wrong = 0
    for nbytes in sizes:
        t = torch.zeros(nbytes // 4, dtype=torch.float32)
        iters = max(3, min(200, (16 << 20) // nbytes))
        times = {impl: [] for impl in groups}
        for impl, g in groups.items():  # warm-up: connections, buffers, algorithm choice
            for _ in range(2):
                dist.all_reduce(t, group=g)
        for run in range(runs):
            order = [list(groups)[k] for k in _bench.balanced_order(len(groups), run)]
            for impl in order:
                g = groups[impl]
                dist.barrier(group=g)
                start = time.perf_counter()
                for _ in range(iters):
                    dist.all_reduce(t, group=g)
                per_call = (time.perf_counter() - start) / iters
                # One checked call per run and side: every element is the sum of the ranks' values.
                t.fill_(float(rank + 1))
                dist.all_reduce(t, group=g)
                if not torch.all(t == world * (world + 1) / 2):
                    wrong += 1
                slowest = torch.tensor([per_call], dtype=torch.float64)
                dist.all_reduce(slowest, op=dist.ReduceOp.MAX, group=groups["gloo"])
                times[impl].append(slowest.item())
        out.append((nbytes, iters, times))
    total_wrong = torch.tensor([wrong], dtype=torch.int64)
    dist.all_reduce(total_wrong, group=groups["gloo"])
    dist.barrier()
    dist.destroy_process_group()
    return {"transport": transport, "points": out, "wrong": int(total_wrong.item())}


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
    wrong = 0
    for n in nprocs:
        res = _bench.spawn(worker, n, sizes, a.runs)
        report(n, a, res)
        wrong += res["wrong"]
    if wrong:
        print(f"plexus-bench-torch: {wrong} checked all_reduce results were wrong", file=sys.stderr)
        return 1
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
                time_us_max=max(ts) * 1e6, runs=len(ts), iters=iters, wrong=res["wrong"]))
        # Like with like (the target): plexus over tcp, under the system's congestion control, as
        # Gloo. As a user gets it (shm on one host): a different transport, for information.
        ratio = busbw["plexus_tcp"] / busbw["gloo"]
        target = 1.2 if nbytes >= (1 << 20) else None
        rows.append(_bench.figure(BENCH, "allreduce busbw plexus_tcp/gloo", ratio, "ratio",
                                  target=target, met=(ratio >= target) if target else None,
                                  nprocs=nprocs, bytes=nbytes, impl="ratio_tcp"))
        rows.append(_bench.figure(BENCH, "allreduce busbw plexus/gloo", busbw["plexus"] / busbw["gloo"],
                                  "ratio", nprocs=nprocs, bytes=nbytes, impl="ratio_default",
                                  plexus_transport=res["transport"]))
    if a.json:
        for r in rows:
            print(_bench.figure_line(r), flush=True)
        return
    print(f"torch.distributed all_reduce, {nprocs} processes, median of {a.runs} runs; plexus as "
          f"a user gets it (over {res['transport']}) and over tcp (system congestion control, as "
          f"gloo); {res['wrong']} wrong results")
    print(f"{'bytes':>10} {'plexus us':>10} {'plexus_tcp us':>14} {'gloo us':>10} "
          f"{'plexus/gloo':>12} {'plexus_tcp/gloo':>16}  target")
    by = {}
    for r in rows:
        by.setdefault(r["bytes"], {})[r["impl"]] = r
    for nbytes, d in by.items():
        ratio = d["ratio_tcp"]
        tgt = "" if "target" not in ratio else f">= {ratio['target']} {'met' if ratio['met'] else 'MISSED'}"
        print(f"{nbytes:>10} {d['plexus']['time_us']:>10.1f} {d['plexus_tcp']['time_us']:>14.1f} "
              f"{d['gloo']['time_us']:>10.1f} {d['ratio_default']['value']:>12.2f} "
              f"{ratio['value']:>16.2f}  {tgt}", flush=True)


if __name__ == "__main__":
    sys.exit(main())
