#!/usr/bin/env python3
"""DistributedDataParallel training of a small MLP on synthetic data, with torch.distributed's
backend "plexus" and with "gloo" in the same invocation: the loss curves side by side (they must
agree) and the time per iteration.

    PYTHONPATH=build/python OMP_NUM_THREADS=1 /usr/bin/python3 examples/torch_ddp.py \
        [--nprocs 2,4] [--hidden 64,512,2048] [--batch 32] [--steps 20] [--runs 5] [--json]

Each rank trains on its own shard of a fixed synthetic regression problem (same seeds for both
backends, so the two runs start from the same weights and see the same data). Both process
groups live in the same processes (plexus is the default group, gloo a new_group over the same
ranks), and the timed runs alternate between them. A run is `--steps` iterations (forward,
backward with DDP's gradient allreduce, SGD step); its time is the slowest rank's mean per
iteration, and each figure is the median of `--runs` runs. `--hidden` sets the MLP's width and so
the gradient size (64: 33 KiB, 512: 1.1 MiB, 2048: 16.5 MiB, 3072: 36.8 MiB of float32
gradients). With --json it writes the figures as JSON lines (plexus/tooling/figures.hpp's
format: bench/figure/value/unit/target/met), as `make bench` records them.
"""

import argparse
import sys
import time

import torch
import torch.distributed as dist
import torch.nn as nn
from torch.nn.parallel import DistributedDataParallel as DDP

import plexus_torch  # noqa: F401  (registers the backend "plexus")
from plexus_torch import _bench

IN, LR = 64, 0.01


def make_model(hidden):
    torch.manual_seed(0)  # same initial weights on every rank and for both backends
    return nn.Sequential(nn.Linear(IN, hidden), nn.ReLU(), nn.Linear(hidden, hidden), nn.ReLU(),
                         nn.Linear(hidden, 1))


def shard(rank, steps, batch):
    g = torch.Generator().manual_seed(1000 + rank)
    w = torch.randn(IN, 1, generator=torch.Generator().manual_seed(7))
    xs = torch.randn(steps, batch, IN, generator=g)
    return xs, xs @ w + 0.01 * torch.randn(steps, batch, 1, generator=g)


def train(model, group, xs, ys):
    """Trains a fresh copy for len(xs) steps; returns (losses averaged over ranks, s/iteration)."""
    ddp = DDP(model, process_group=group)
    opt = torch.optim.SGD(ddp.parameters(), lr=LR)
    losses = []
    dist.barrier(group=group)
    start = time.perf_counter()
    for x, y in zip(xs, ys):
        opt.zero_grad(set_to_none=True)
        loss = nn.functional.mse_loss(ddp(x), y)
        loss.backward()
        opt.step()
        losses.append(loss.detach())
    per_iter = (time.perf_counter() - start) / len(xs)
    return torch.stack(losses), per_iter


def worker(rank, world, init_method, widths, steps, runs, batch):
    _bench.pin_threads()
    dist.init_process_group("plexus", init_method=init_method, rank=rank, world_size=world)
    groups = {"plexus": dist.group.WORLD, "gloo": dist.new_group(backend="gloo")}
    xs, ys = shard(rank, steps, batch)
    out = []
    for hidden in widths:
        params = sum(p.numel() for p in make_model(hidden).parameters())
        times = {b: [] for b in groups}
        curves = {}
        for b, g in groups.items():  # warm-up: bucket rebuild, connections
            train(make_model(hidden), g, xs[:3], ys[:3])
        for run in range(runs):
            order = list(groups) if run % 2 == 0 else list(reversed(list(groups)))
            for b in order:
                losses, per_iter = train(make_model(hidden), groups[b], xs, ys)
                slowest = torch.tensor([per_iter], dtype=torch.float64)
                dist.all_reduce(slowest, op=dist.ReduceOp.MAX, group=groups["gloo"])
                times[b].append(slowest.item())
                dist.all_reduce(losses, group=groups["gloo"])  # the mean loss over ranks
                curves[b] = (losses / world).tolist()
        out.append({"hidden": hidden, "params": params, "times": times, "curves": curves})
    dist.barrier()
    dist.destroy_process_group()
    return out


def main():
    p = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    p.add_argument("--nprocs", default="2,4")
    p.add_argument("--hidden", default="64,512,2048")
    p.add_argument("--steps", type=int, default=20)
    p.add_argument("--batch", type=int, default=32,
                   help="samples per rank and step (the compute grows with batch x width^2)")
    p.add_argument("--runs", type=int, default=5)
    p.add_argument("--json", action="store_true")
    a = p.parse_args()
    nprocs = [int(x) for x in a.nprocs.split(",")]
    widths = [int(x) for x in a.hidden.split(",")]
    ok = True
    for n in nprocs:
        res = _bench.spawn(worker, n, widths, a.steps, a.runs, a.batch)
        for r in res:
            t = {b: _bench.median(v) for b, v in r["times"].items()}
            cp, cg = r["curves"]["plexus"], r["curves"]["gloo"]
            diff = max(abs(x - y) / max(abs(y), 1e-12) for x, y in zip(cp, cg))
            same = diff <= 1e-4
            ok = ok and same
            grad_bytes = r["params"] * 4
            speed = t["gloo"] / t["plexus"]
            if a.json:
                for b in ("plexus", "gloo"):
                    print(_bench.figure_line(_bench.figure(
                        "torch_ddp", "ddp iteration time", t[b] * 1e3, "ms", impl=b, nprocs=n,
                        hidden=r["hidden"], grad_bytes=grad_bytes, runs=a.runs, steps=a.steps, batch=a.batch,
                        time_ms_min=min(r["times"][b]) * 1e3,
                        time_ms_max=max(r["times"][b]) * 1e3)))
                print(_bench.figure_line(_bench.figure(
                    "torch_ddp", "ddp speed plexus/gloo", speed, "ratio", target=1.0,
                    met=speed >= 1.0, nprocs=n, hidden=r["hidden"], grad_bytes=grad_bytes)))
                print(_bench.figure_line(_bench.figure(
                    "torch_ddp", "loss curve max relative difference", diff, "fraction",
                    target=1e-4, met=same, nprocs=n, hidden=r["hidden"],
                    final_loss_plexus=cp[-1], final_loss_gloo=cg[-1])), flush=True)
            else:
                print(f"{n} processes, MLP width {r['hidden']} ({grad_bytes / 1024:.0f} KiB of "
                      f"gradients), median of {a.runs} runs of {a.steps} steps:")
                print(f"  time/iteration: plexus {t['plexus'] * 1e3:.2f} ms, gloo "
                      f"{t['gloo'] * 1e3:.2f} ms, plexus speed {speed:.2f}x gloo's")
                print(f"  loss: " + " ".join(f"{x:.4f}" for x in cp[:: max(1, len(cp) // 8)]) +
                      f" ... {cp[-1]:.4f} (plexus)")
                print(f"        " + " ".join(f"{x:.4f}" for x in cg[:: max(1, len(cg) // 8)]) +
                      f" ... {cg[-1]:.4f} (gloo); max relative difference {diff:.1e}"
                      f"{'' if same else '  DIFFERENT'}")
    return 0 if ok else 1


if __name__ == "__main__":
    sys.exit(main())
