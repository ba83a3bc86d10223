#!/usr/bin/env python3
"""Converts the input of the released JellyBean optimizer (VQA workflow, medium setup) into the
Plexus placement format (docs/placement.md).

Usage: convert_jellybean.py RAW_DIR OUT.json
RAW_DIR holds the release's files (examples/data/placement/jellybean-vqa/raw in this repository).

Mapping:
- logical_graph.csv -> workflow edges; throughput_normalization_ratios.csv -> rate_ratio;
  message_sizes.csv -> message_kb ("default" in the release means "any variant": "*").
- Each worker of workers_specs.csv becomes its own worker type (the release profiles every
  worker separately); GPUs are the workers whose name contains "gpu".
- workers_partition.json -> tiers "edge" (first list) and "cloud" (second list), one location each.
- workers_workers_link.csv: edge -> cloud costs 1.0 per unit; with COMM_COST_SCALING_FACTOR 0.1
  this is 0.1 per GB, the lower end of the paper's 0.1-0.3 per GB. Rows from cloud to edge (10.0)
  describe traffic flowing downwards, which Plexus forbids (assumption A2). Workers of one tier
  have no row: free (A1).
- sources_workers_link.csv: sources reach edge workers for free and cloud workers at 1.0: the
  sources sit on the edge tier.
- execution_profile_p50/p75/p90.csv -> p50/p75/p90 (the release optimizes with p75).
- accuracy_profiles.json (converted from the release's pickles) -> accuracy_profiles.
- input_injection_rates.csv -> source rates; accuracy_requirement.json -> objective.
- Link latency and bandwidth are not in the release; 20 ms and 1 Gb/s edge -> cloud are Plexus
  assumptions used by the simulator only.
"""
import csv
import json
import os
import sys


def rows(path):
    with open(path, newline="") as f:
        return [[cell for cell in row if cell != ""] for row in csv.reader(f) if row]


def main():
    if len(sys.argv) != 3:
        sys.exit(__doc__)
    raw, out = sys.argv[1], sys.argv[2]
    p = lambda name: os.path.join(raw, name)

    edges_raw = rows(p("logical_graph.csv"))
    ratios = {(a, b): float(r) for a, b, r in rows(p("throughput_normalization_ratios.csv"))}
    rates = {name: float(r) for name, r in rows(p("input_injection_rates.csv"))}
    accuracy = json.load(open(p("accuracy_profiles.json")))
    requirement = json.load(open(p("accuracy_requirement.json")))
    partition = json.load(open(p("workers_partition.json")))
    specs = rows(p("workers_specs.csv"))

    ml_ops = {entry["op"]: entry for entry in accuracy["operators"]}
    sources = sorted({a for a, _ in edges_raw} - {b for _, b in edges_raw})
    operators = [{"name": s, "kind": "source"} for s in sources]
    ordered = []
    for a, b in edges_raw:
        for name in (a, b):
            if name not in sources and name not in ordered:
                ordered.append(name)
    for name in ordered:
        variants = list(ml_ops[name]["rows"].keys())
        op = {"name": name, "kind": "ml", "variants": variants}
        if sum(1 for _, b in edges_raw if b == name) > 1:
            op["combine"] = "join"
        operators.append(op)

    sizes = {}
    for up, down, up_v, down_v, kb in rows(p("message_sizes.csv")):
        sizes.setdefault((up, down), []).append(
            {"from_variant": "*" if up_v == "default" else up_v,
             "to_variant": "*" if down_v == "default" else down_v, "kb": float(kb)})
    edges = [{"from": a, "to": b, "rate_ratio": ratios.get((a, b), 1.0),
              "message_kb": sizes[(a, b)]} for a, b in edges_raw]

    accuracy_profiles = []
    for name in ordered:
        entry = ml_ops[name]
        accuracy_profiles.append({
            "operator": name, "inputs": entry["inputs"],
            "variants": {v: [{"in": r["in"], "out": r["out"]} for r in rs]
                         for v, rs in entry["rows"].items()}})

    latency = {}
    for percentile in ("p50", "p75", "p90"):
        for row in rows(p(f"execution_profile_{percentile}.csv")):
            op, worker, variant, ms = row[:4]
            latency.setdefault((op, variant, worker), {})[percentile] = float(ms)
    execution_profiles = [
        {"operator": op, "variant": variant, "worker_type": worker, **values}
        for (op, variant, worker), values in latency.items()]

    tier_of = {}
    for tier, names in zip(("edge", "cloud"), partition):
        for name in names:
            tier_of[name] = tier
    worker_types = [{"name": name, "price_per_hour": float(price), "gpu": "gpu" in name}
                    for name, price in specs]
    workers = [{"name": name, "type": name, "tier": tier_of[name]} for name, _ in specs]

    links = rows(p("workers_workers_link.csv"))
    up_cost = {float(c) for a, b, c in links if tier_of[a] == "edge" and tier_of[b] == "cloud"}
    assert len(up_cost) == 1, up_cost
    scaling = 0.1  # COMM_COST_SCALING_FACTOR in config.yaml
    network = [{"from": "edge", "to": "cloud", "price_per_gb": up_cost.pop() * scaling,
                "latency_ms": 20.0, "bandwidth_gbps": 1.0}]
    source_list = [{"operator": s, "tier": "edge", "location": 0, "rate": rates[s]}
                   for s in sources]

    problem = {
        "name": "jellybean-vqa-medium",
        "description": (
            "Input of the released JellyBean optimizer for the VQA workflow, medium setup "
            "(VLDB'23, Table 5.4), converted by tools/placement/convert_jellybean.py from "
            "examples/data/placement/jellybean-vqa/raw (MIT licence, see LICENSE). Profiles are "
            "the release's real measurements; link latency/bandwidth are Plexus assumptions."),
        "workflow": {"operators": operators, "edges": edges},
        "accuracy_profiles": accuracy_profiles,
        "execution_profiles": execution_profiles,
        "infrastructure": {
            "tiers": [{"name": "edge", "locations": 1}, {"name": "cloud", "locations": 1}],
            "worker_types": worker_types, "workers": workers, "network": network,
            "sources": source_list},
        "objective": {"accuracy_target": requirement["threshold"], "sink": requirement["sink"],
                      "input_rate": max(rates.values())},
        "options": {"model_selection_beam": 10, "worker_assignment_beam": 10,
                    "topological_orders": 10, "latency_percentile": "p75"},
    }
    with open(out, "w") as f:
        json.dump(problem, f, indent=1)
        f.write("\n")


if __name__ == "__main__":
    main()
