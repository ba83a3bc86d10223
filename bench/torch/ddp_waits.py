#!/usr/bin/env python3
"""Where DDP iterations wait: plexus vs gloo, paired short runs, with per-thread scheduler figures.

    PYTHONPATH=build/python OMP_NUM_THREADS=1 /usr/bin/python3 bench/torch/ddp_waits.py NPROCS WIDTH STEPS PAIRS

Trains examples/torch_ddp.py's MLP (batch 4) for STEPS steps per run, PAIRS runs per backend
alternating plexus/gloo, and prints the median ms/iteration of each, the median of the per-pair
ratios gloo/plexus (robust to load that changes between pairs), and per thread name (summed over
a rank's threads of that name, rank 0) the CPU time, the time runnable but not running (runqueue
wait) and the voluntary sleeps per iteration, from /proc/self/task/*/schedstat and status.
"""
import os, sys, time, re
sys.path.insert(0, os.path.join(os.path.dirname(os.path.abspath(__file__)), "..", "..", "examples"))
import torch, torch.distributed as dist, torch.nn as nn
from torch.nn.parallel import DistributedDataParallel as DDP
import plexus_torch
from plexus_torch import _bench
import torch_ddp as T

def threads():
    out = {}
    for tid in os.listdir('/proc/self/task'):
        try:
            name = open(f'/proc/self/task/{tid}/comm').read().strip()
            a, b, c = map(int, open(f'/proc/self/task/{tid}/schedstat').read().split())
            st = open(f'/proc/self/task/{tid}/status').read()
            vol = int(re.search(r'\nvoluntary_ctxt_switches:\s+(\d+)', st).group(1))
            out[tid] = (name, a, b, vol)
        except Exception:
            pass
    return out

def run(model, group, xs, ys):
    ddp = DDP(model, process_group=group)
    opt = torch.optim.SGD(ddp.parameters(), lr=0.01)
    dist.barrier(group=group)
    t0 = threads(); start = time.perf_counter(); bwd = 0.0
    its = []
    for x, y in zip(xs, ys):
        i0 = time.perf_counter()
        opt.zero_grad(set_to_none=True)
        loss = nn.functional.mse_loss(ddp(x), y)
        b = time.perf_counter(); loss.backward(); bwd += time.perf_counter() - b
        opt.step()
        its.append((time.perf_counter() - i0) * 1e3)
    el = time.perf_counter() - start; t1 = threads()
    agg = {}
    for tid, v in t1.items():
        if tid in t0:
            o = t0[tid]; name = v[0]
            a = agg.setdefault(name, [0, 0, 0])
            a[0] += v[1] - o[1]; a[1] += v[2] - o[2]; a[2] += v[3] - o[3]
    n = len(xs)
    return el / n * 1e3, bwd / n * 1e3, its, {k: (v[0] / n / 1e6, v[1] / n / 1e6, v[2] / n) for k, v in agg.items() if v[0] > 0}

def worker(rank, world, init, hidden, steps, reps):
    _bench.pin_threads()
    dist.init_process_group("plexus", init_method=init, rank=rank, world_size=world)
    groups = {"plexus": dist.group.WORLD, "gloo": dist.new_group(backend="gloo")}
    xs, ys = T.shard(rank, steps, 4)
    res = {b: [] for b in groups}
    for b, g in groups.items(): run(T.make_model(hidden), g, xs[:3], ys[:3])
    for r in range(reps):
        for b in (groups if r % 2 == 0 else list(reversed(list(groups)))):
            res[b].append(run(T.make_model(hidden), groups[b], xs, ys))
    dist.barrier(); dist.destroy_process_group()
    return res

if __name__ == "__main__":
    world = int(sys.argv[1]); hidden = int(sys.argv[2]); steps = int(sys.argv[3]); reps = int(sys.argv[4])
    res = _bench.spawn(worker, world, hidden, steps, reps)
    import statistics as st
    P, G = res["plexus"], res["gloo"]
    ratios = [g[0] / p[0] for p, g in zip(P, G)]
    print(f"plexus median {st.median(r[0] for r in P):.1f} ms/iter, gloo median {st.median(r[0] for r in G):.1f}; paired gloo/plexus median {st.median(ratios):.2f} (n={len(ratios)}); mean plexus {st.mean(r[0] for r in P):.1f} gloo {st.mean(r[0] for r in G):.1f}")
    for b, runs in res.items():
        agg = {}
        for r in runs:
            for name, v in r[3].items():
                a = agg.setdefault(name, [0, 0, 0])
                for k in range(3): a[k] += v[k] / len(runs)
        for name, (run_ms, rq_ms, vol) in sorted(agg.items()):
            print(f"  {b:6} {name:16} run {run_ms:6.2f} ms/iter  rqwait {rq_ms:6.2f} ms/iter  sleeps {vol:6.1f}/iter")
