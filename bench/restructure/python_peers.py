#!/usr/bin/env python3
"""The restructuring stages of Fianchetto's five pipelines as a user writes them today: chains of
numpy and torch (CPU) operations, one thread, at the shapes plexus-bench-restructure passes;
with --device cuda, torch operations on the GPU from device tensors, then .cpu() (the result in
host memory, ready to send). Prints one JSON object per line: {"peer", "stage", "ms"} (the median
of --runs runs) and checks each stage's output shape and type once. Started by
plexus-bench-restructure --compare (--only device --compare for the GPU)."""
import argparse
import json
import statistics
import sys
import time


def timed(fn, runs):
    fn()  # warm up (allocations, first touch)
    times = []
    for _ in range(runs):
        t0 = time.perf_counter()
        fn()
        times.append((time.perf_counter() - t0) * 1e3)
    return statistics.median(times)


def numpy_stages(np, s):
    rng = np.random.default_rng(1)
    frame = rng.integers(0, 256, size=(s["video_h"], s["video_w"], 3), dtype=np.uint8)
    mag = rng.random((s["sound_frames"], s["sound_bins"]), dtype=np.float32)
    mel = rng.random(s["sound_bins"], dtype=np.float32)
    spec = rng.random((s["brain_w"], s["brain_b"], s["brain_e"]), dtype=np.float32)
    base = rng.random((s["brain_b"], s["brain_e"]), dtype=np.float32) + 0.5
    parts_u8 = [rng.integers(0, 256, size=(s["pii_rows"], s["pii_cols"]), dtype=np.uint8)
                for _ in range(s["pii_parts"])]
    parts_i32 = [rng.integers(-2**31, 2**31 - 1, size=(s["db_rows"], s["db_cols"]),
                              dtype=np.int32) for _ in range(s["db_parts"])]
    h, w = s["video_h"], s["video_w"]

    def video():
        x = frame.astype(np.float32) * np.float32(1 / 255)
        x = x.reshape(h // 2, 2, w // 2, 2, 3).max(axis=(1, 3))
        return np.ascontiguousarray(x.transpose(2, 0, 1)).astype(np.float16)

    def sound():
        p = mag ** 2
        p += np.float32(1e-10)
        p *= mel
        p /= np.float32(1.0)
        return np.log10(p).astype(np.float16)

    def brain():
        return (spec ** 2 / base * np.float32(0.5)).astype(np.float16)

    def pii():
        return np.concatenate(parts_u8, axis=0).ravel()

    def db():
        return np.concatenate(parts_i32, axis=0).reshape(-1, s["db_cols"]).astype(np.float32)

    return {"video-surveillance": video, "sound-detection": sound, "brain-stimulation": brain,
            "pii-redaction": pii, "db-hash-join": db}


def torch_stages(torch, s, device="cpu"):
    g = torch.Generator().manual_seed(1)
    frame = torch.randint(0, 256, (s["video_h"], s["video_w"], 3), dtype=torch.uint8, generator=g)
    mag = torch.rand((s["sound_frames"], s["sound_bins"]), generator=g)
    mel = torch.rand(s["sound_bins"], generator=g)
    spec = torch.rand((s["brain_w"], s["brain_b"], s["brain_e"]), generator=g)
    base = torch.rand((s["brain_b"], s["brain_e"]), generator=g) + 0.5
    parts_u8 = [torch.randint(0, 256, (s["pii_rows"], s["pii_cols"]), dtype=torch.uint8,
                              generator=g) for _ in range(s["pii_parts"])]
    parts_i32 = [torch.randint(-2**31, 2**31 - 1, (s["db_rows"], s["db_cols"]), dtype=torch.int32,
                               generator=g) for _ in range(s["db_parts"])]
    h, w = s["video_h"], s["video_w"]
    if device != "cpu":
        frame, mag, mel, spec, base = (t.to(device) for t in (frame, mag, mel, spec, base))
        parts_u8 = [t.to(device) for t in parts_u8]
        parts_i32 = [t.to(device) for t in parts_i32]

    def video():
        x = frame.to(torch.float32) * (1 / 255)
        x = x.reshape(h // 2, 2, w // 2, 2, 3).amax(dim=(1, 3))
        return x.permute(2, 0, 1).contiguous().to(torch.float16)

    def sound():
        p = mag.pow(2)
        p.add_(1e-10)
        p.mul_(mel)
        p.div_(1.0)
        return p.log10_().to(torch.float16)

    def brain():
        return (spec.pow(2) / base * 0.5).to(torch.float16)

    def pii():
        return torch.cat(parts_u8, dim=0).flatten()

    def db():
        return torch.cat(parts_i32, dim=0).reshape(-1, s["db_cols"]).to(torch.float32)

    stages = {"video-surveillance": video, "sound-detection": sound, "brain-stimulation": brain,
              "pii-redaction": pii, "db-hash-join": db}
    if device == "cpu":
        return stages

    def to_host(fn):
        def run():
            out = fn().cpu()
            torch.cuda.synchronize()
            return out
        return run
    return {name: to_host(fn) for name, fn in stages.items()}


def main():
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("--runs", type=int, default=5)
    ap.add_argument("--shapes", required=True, help="JSON object of the stages' shapes")
    ap.add_argument("--device", default="cpu", choices=["cpu", "cuda"])
    args = ap.parse_args()
    shapes = json.loads(args.shapes)
    peers = []
    if args.device == "cuda":
        import torch
        if not torch.cuda.is_available():
            raise SystemExit(f"python_peers: torch {torch.__version__} has no usable CUDA device")
        peers.append(("torch_cuda", torch_stages(torch, shapes, "cuda")))
    else:
        try:
            import numpy as np
            peers.append(("numpy", numpy_stages(np, shapes)))
        except ImportError as e:
            print(f"python_peers: numpy unavailable: {e}", file=sys.stderr)
        try:
            import torch
            torch.set_num_threads(1)
            peers.append(("torch", torch_stages(torch, shapes)))
        except ImportError as e:
            print(f"python_peers: torch unavailable: {e}", file=sys.stderr)
    for peer, stages in peers:
        for stage, fn in stages.items():
            out = fn()
            size = out.numel() if hasattr(out, "numel") else out.size
            if size == 0:
                raise SystemExit(f"{peer} {stage}: empty output")
            print(json.dumps({"peer": peer, "stage": stage, "ms": timed(fn, args.runs)}),
                  flush=True)
    return 0


if __name__ == "__main__":
    sys.exit(main())
