#!/usr/bin/python3
"""Plots plexus-moe-demo's samples-over-time comparison: plot.py SUMMARY.json OUT.png.

Uses Debian's python3-matplotlib; without it, says so and exits 0 (the plot is optional)."""
import json
import sys


def main():
    if len(sys.argv) != 3:
        print("usage: plexus-moe-demo-plot.py SUMMARY.json OUT.png", file=sys.stderr)
        return 2
    try:
        import matplotlib
        matplotlib.use("Agg")
        import matplotlib.pyplot as plt
    except ImportError as e:
        print(f"plexus-moe-demo: no plot ({e}); install python3-matplotlib")
        return 0
    with open(sys.argv[1]) as f:
        s = json.load(f)
    fig, ax = plt.subplots(figsize=(8, 4.5))
    for key, label, color in (("elastic", "Lazarus (elastic)", "tab:blue"),
                              ("checkpoint_restart", "checkpoint restart", "tab:red")):
        run = s[key]
        ax.step([p[0] for p in run["series"]], [p[1] for p in run["series"]], where="post",
                label=f"{label}: {run['seconds']:.1f} s", color=color)
        fail = run.get("failure")
        if fail:
            t = fail["t"] - fail["recovery_s"]
            ax.axvline(t, color=color, linestyle=":", linewidth=1)
            ax.annotate(f"rank {s['kill_rank']} killed\nrecovery {fail['recovery_s']:.2f} s",
                        (t, fail["samples"]), textcoords="offset points", xytext=(5, -30),
                        fontsize=8, color=color)
    ax.set_xlabel("time (s)")
    ax.set_ylabel("samples trained (progress kept)")
    ax.set_title(f"MoE training on {s['ranks']} ranks, one killed: time lost "
                 f"{s['elastic']['time_lost_s']:.2f} s vs {s['checkpoint_restart']['time_lost_s']:.2f} s")
    ax.legend(loc="upper left")
    ax.grid(alpha=0.3)
    fig.tight_layout()
    fig.savefig(sys.argv[2], dpi=100)
    print(f"plexus-moe-demo: plot written to {sys.argv[2]}")
    return 0


if __name__ == "__main__":
    sys.exit(main())
