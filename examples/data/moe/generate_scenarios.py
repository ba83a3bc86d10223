#!/usr/bin/env python3
"""Writes the synthetic GPT-S/M/L-like scenarios of this folder (deterministic; rerun to rebuild).

The per-layer expert loads are synthetic, shaped like the SmartMoE traces the Lazarus paper uses:
the two hottest experts of a layer carry between 60% and 87% of its tokens, the rest decays
geometrically, and which experts are hot changes from layer to layer.
"""
import json
import random

MODELS = {
    # name: (experts, expert state bytes: FFN weights + Adam state, hidden size noted in text)
    "gpt-s": (8, 48 << 20, "GPT-S-like: 12 layers, 8 experts, hidden 768"),
    "gpt-m": (12, 84 << 20, "GPT-M-like: 12 layers, 12 experts, hidden 1024"),
    "gpt-l": (16, 112 << 20, "GPT-L-like: 12 layers, 16 experts, hidden 1280"),
}
LAYERS = 12


def layer_loads(rng, experts, top2):
    rest = 1.0 - top2
    tail = [0.7 ** i for i in range(experts - 2)]
    scale = rest / sum(tail)
    loads = [top2 * 0.6, top2 * 0.4] + [t * scale for t in tail]
    rng.shuffle(loads)
    return [round(x, 5) for x in loads]


def main():
    for name, (experts, state_bytes, text) in MODELS.items():
        rng = random.Random(f"plexus-moe-{name}")
        shares = [0.60 + (0.87 - 0.60) * i / (LAYERS - 1) for i in range(LAYERS)]
        rng.shuffle(shares)
        scenario = {
            "name": f"{name} (synthetic)",
            "description": text + "; 10 nodes, c = 6 slots, f = 2. SYNTHETIC loads: the top 2 "
            "experts carry 60-87% of a layer's tokens, like the SmartMoE traces used by "
            "Lazarus. Timing constants are illustrative inputs, not measurements.",
            "nodes": 10,
            "slots_per_node": 6,
            "min_replicas": 2,
            "layer_loads": [layer_loads(rng, experts, s) for s in shares],
            "training": {
                "samples_per_step": 256,
                "tokens_per_sample": 1024,
                "seconds_per_token": 3e-6,
                "fixed_step_s": 1.0,
                "checkpoint_every_steps": 30,
                "checkpoint_s": 10,
                "restart_s": 120,
                "reconfigure_s": 5,
                "bandwidth_bytes_per_s": 1.25e9,
                "expert_state_bytes": state_bytes,
                "ep_size": 4,
                "scale_up_wait_s": 120,
                "max_nodes": 10,
            },
        }
        with open(f"{name}.json", "w") as f:
            json.dump(scenario, f, indent=1)
            f.write("\n")


if __name__ == "__main__":
    main()
