#!/usr/bin/env python3
"""The peer of plexus-bench-cuda: torch.distributed's Gloo backend running allreduce, broadcast
and allgather on CUDA tensors (and, for reference, host tensors), measured the same way: the
same sizes, input pattern and check,
iterations that move about 256 MiB per rank (5 to 1000), the median of --runs runs of the slowest
rank's mean time per call. Prints one JSON object per point, the figures of plexus-bench-cuda
with impl "torch_gloo". Needs a torch built with CUDA and at least one GPU (ranks share GPUs
round-robin, as plexus-bench-cuda's do).

  python3 bench/collectives/cuda_torch_peer.py --np 2 --sizes 64K,1M,16M,64M --runs 5 \
      [--ops allreduce,broadcast,allgather]
"""
import argparse
import datetime
import json
import os
import socket
import statistics
import sys
import time


def parse_size(text):
    units = {"K": 1 << 10, "M": 1 << 20, "G": 1 << 30}
    text = text.strip()
    if text and text[-1].upper() in units:
        return int(text[:-1]) * units[text[-1].upper()]
    return int(text)


def iterations_for(nbytes):
    return max(5, min(1000, (256 << 20) // max(nbytes, 1)))


def pattern(torch, count, rank):
    """bench_common's InputValue: (i * 7 + rank * 3) % 17, exact in f32 for any sum order."""
    idx = torch.arange(count, dtype=torch.int64)
    return ((idx * 7 + rank * 3) % 17).to(torch.float32)


def worker(rank, args, port):
    import torch
    import torch.distributed as dist

    dist.init_process_group("gloo", init_method=f"tcp://127.0.0.1:{port}", rank=rank,
                            world_size=args.np, timeout=datetime.timedelta(seconds=300))
    torch.cuda.set_device(rank % torch.cuda.device_count())
    n = args.np
    for size_text in args.sizes.split(","):
        nbytes_asked = parse_size(size_text)
        for op in args.ops.split(","):
            # plexus-bench-cuda's shapes: the point's size is the whole buffer (allgather: the
            # gathered output, count per rank = size / 4 / n).
            count = max(nbytes_asked // 4 // (n if op == "allgather" else 1), 1)
            host = pattern(torch, count, rank)
            if op == "allreduce":
                want = sum(pattern(torch, count, r) for r in range(n))
                factor = 2 * (n - 1) / n if n > 1 else 1
            elif op == "broadcast":
                want = pattern(torch, count, 0)
                factor = 1
            else:
                want = torch.cat([pattern(torch, count, r) for r in range(n)])
                factor = (n - 1) / n if n > 1 else 1
            nbytes = want.numel() * 4 if op == "allgather" else count * 4
            iters = iterations_for(nbytes)
            for memory in ("host", "cuda"):
                base = host if memory == "host" else host.cuda()
                t = base.clone()
                gathered = [torch.empty_like(base) for _ in range(n)]

                def call():
                    if op == "allreduce":
                        dist.all_reduce(t)  # in place: the timed calls' values grow (inf too)
                    elif op == "broadcast":
                        dist.broadcast(t, src=0)
                    else:
                        dist.all_gather(gathered, t)

                call()
                if memory == "cuda":
                    torch.cuda.synchronize()
                got = torch.cat([g.cpu() for g in gathered]) if op == "allgather" else t.cpu()
                wrong = float((got != want).sum().item())
                wrong_max = torch.tensor([wrong], dtype=torch.float64)
                dist.all_reduce(wrong_max, op=dist.ReduceOp.MAX)
                times = []
                for _ in range(args.runs):
                    dist.barrier()
                    start = time.perf_counter()
                    for _ in range(iters):
                        call()
                    if memory == "cuda":
                        torch.cuda.synchronize()
                    mean_us = (time.perf_counter() - start) / iters * 1e6
                    slowest = torch.tensor([mean_us], dtype=torch.float64)
                    dist.all_reduce(slowest, op=dist.ReduceOp.MAX)
                    times.append(slowest.item())
                if rank == 0:
                    median = statistics.median(times)
                    print(json.dumps({
                        "bench": "collectives_cuda", "figure": f"{op}_time", "value": median,
                        "unit": "us", "impl": "torch_gloo", "op": op, "memory": memory,
                        "transport": "tcp", "np": n, "bytes": nbytes, "runs": args.runs,
                        "iters": iters, "min": min(times), "max": max(times),
                        "busbw_gbs": nbytes * factor / median / 1e3,
                        "wrong": wrong_max.item(), "torch": torch.__version__}), flush=True)
    dist.destroy_process_group()


def main():
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--np", type=int, default=2)
    parser.add_argument("--sizes", default="64K,1M,16M,64M")
    parser.add_argument("--runs", type=int, default=5)
    parser.add_argument("--ops", default="allreduce,broadcast,allgather")
    args = parser.parse_args()
    unknown = set(args.ops.split(",")) - {"allreduce", "broadcast", "allgather"}
    if unknown:
        sys.exit(f"cuda_torch_peer.py: --ops: unknown {', '.join(sorted(unknown))}; "
                 "allreduce, broadcast and allgather are measured")
    try:
        import torch
        import torch.multiprocessing as mp
    except ImportError as e:
        sys.exit(f"cuda_torch_peer.py: torch is not importable by {sys.executable}: {e}")
    if not torch.cuda.is_available():
        sys.exit(f"cuda_torch_peer.py: torch {torch.__version__} sees no CUDA device")
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        port = s.getsockname()[1]
    mp.spawn(worker, args=(args, port), nprocs=args.np, join=True)


if __name__ == "__main__":
    main()
