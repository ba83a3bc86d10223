"""Helpers shared by examples/torch_ddp.py and bench/torch (not part of the backend's API).

figure_line() writes the benchmarks' JSON line exactly as plexus/tooling/figures.hpp does
(nlohmann::json::dump(): keys sorted, no spaces, non-finite values as null, target/met only when
set, extra fields never override the first ones). spawn() runs fn(rank, world, store, *args) on
`world` local processes with a file store and returns rank 0's result.
"""

import json
import math
import os
import tempfile
import traceback

import torch.multiprocessing as mp


def figure(bench, name, value, unit, target=None, met=None, **extra):
    obj = {"bench": bench, "figure": name,
           "value": value if isinstance(value, int) or math.isfinite(value) else None,
           "unit": unit}
    if target is not None:
        obj["target"] = target
    if met is not None:
        obj["met"] = bool(met)
    for k, v in extra.items():
        obj.setdefault(k, v)
    return obj


def figure_line(obj):
    def clean(v):
        if isinstance(v, float) and not math.isfinite(v):
            return None
        if isinstance(v, dict):
            return {k: clean(x) for k, x in v.items()}
        if isinstance(v, (list, tuple)):
            return [clean(x) for x in v]
        return v
    return json.dumps(clean(obj), sort_keys=True, separators=(",", ":"), ensure_ascii=False)


def median(xs):
    s = sorted(xs)
    n = len(s)
    return s[n // 2] if n % 2 else 0.5 * (s[n // 2 - 1] + s[n // 2])


def balanced_order(n, row):
    """Row `row` of a balanced (Williams) Latin square of n items, as bench/common/order.hpp:
    the launch order of one run, so that each item goes first, and follows each other, alike."""
    if n == 0:
        return []
    order, low, high = [0], 1, n - 1
    while len(order) < n:
        if len(order) % 2 == 1:
            order.append(low)
            low += 1
        else:
            order.append(high)
            high -= 1
    order = [(k + row) % n for k in order]
    if n % 2 == 1 and (row // n) % 2 == 1:
        order.reverse()
    return order


def _worker(rank, world, store_dir, fn, args, results):
    try:
        results.put((rank, True, fn(rank, world, f"file://{store_dir}/store", *args)))
    except BaseException:
        results.put((rank, False, traceback.format_exc()))
        raise


def spawn(fn, world, *args, timeout_s=1800):
    ctx = mp.get_context("spawn")
    results = ctx.Queue()
    with tempfile.TemporaryDirectory() as store_dir:
        procs = [ctx.Process(target=_worker, args=(r, world, store_dir, fn, args, results))
                 for r in range(world)]
        for p in procs:
            p.start()
        out = {}
        try:
            for _ in range(world):
                rank, ok, value = results.get(timeout=timeout_s)
                if not ok:
                    raise RuntimeError(f"rank {rank} failed:\n{value}")
                out[rank] = value
        finally:
            for p in procs:
                p.join(10)
                if p.is_alive():
                    p.kill()
                    p.join()
    return out[0]


def pin_threads():
    # One intra-op thread per rank: the ranks already share the machine's cores.
    import torch
    torch.set_num_threads(int(os.environ.get("OMP_NUM_THREADS", "1")))
