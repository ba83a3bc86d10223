#!/usr/bin/env python3
"""Writes the bundled synthetic placement scenarios (examples/data/placement/*.json).

Usage: make_scenarios.py OUT_DIR

Two workflows on four infrastructures shaped after JellyBean's Table 5.4 (VLDB'23): tiers edge ->
hub -> cloud, worker mixes growing from small to xlarge, CPU prices growing sub-linearly with
vCPUs, a V100-class GPU, 0.1-0.3 per GB between tiers.
- vqa-*: image features + speech recognition -> question answering. Built around the real
  JellyBean measurements (jellybean-vqa/raw): latencies and accuracies are the release's, on the
  release's worker types renamed by size; prices and infrastructures are synthetic.
- aicity-*: detection -> re-identification -> tracking. Synthetic but plausible profiles
  (YOLOv5-like detectors, OSNet/ResNet re-identification, DeepSORT-like tracking).
The script is deterministic; rerun it after changing it and commit its output.
"""
import json
import os
import sys

# CPU worker types: vCPUs -> price grows sub-linearly (0.06 * v^0.85 per hour).
CPU_TYPES = [("cpu-2v", 2), ("cpu-4v", 4), ("cpu-8v", 8), ("cpu-16v", 16), ("cpu-32v", 32)]
GPU_TYPE = ("v100", 2.48)
# An edge GPU (T4-class): 1.8x the V100's latency; synthetic in every scenario.
EDGE_GPU = ("t4", 0.75, 1.8)


def cpu_price(vcpus):
    return round(0.06 * vcpus ** 0.85, 4)


def worker_types():
    types = [{"name": n, "price_per_hour": cpu_price(v), "gpu": False} for n, v in CPU_TYPES]
    types.append({"name": GPU_TYPE[0], "price_per_hour": GPU_TYPE[1], "gpu": True})
    types.append({"name": EDGE_GPU[0], "price_per_hour": EDGE_GPU[1], "gpu": True})
    return types


# Infrastructures: per tier, (locations, replicated, [(type, count) per location]).
INFRA = {
    "small": {
        "tiers": [("edge", 1, False, [("cpu-2v", 2), ("cpu-4v", 1)]),
                  ("cloud", 1, False, [("cpu-8v", 1), ("v100", 1)])],
        "rate": 10},
    "medium": {
        "tiers": [("edge", 1, False, [("cpu-2v", 2), ("cpu-4v", 1), ("cpu-8v", 2), ("cpu-16v", 1)]),
                  ("cloud", 1, False, [("cpu-32v", 1), ("v100", 3)])],
        "rate": 40},
    "large": {
        "tiers": [("edge", 1, False, [("cpu-2v", 2), ("cpu-4v", 3), ("cpu-8v", 2), ("cpu-16v", 1),
                                          ("t4", 1)]),
                  ("hub", 1, False, [("cpu-8v", 3), ("cpu-16v", 2), ("v100", 2)]),
                  ("cloud", 1, False, [("cpu-32v", 4), ("v100", 6)])],
        "rate": 80},
    "xlarge": {
        "tiers": [("edge", 8, True, [("cpu-4v", 2), ("cpu-8v", 2), ("t4", 1)]),
                  ("hub", 4, False, [("cpu-16v", 2), ("v100", 1)]),
                  ("cloud", 1, False, [("cpu-32v", 8), ("v100", 16)])],
        "rate": 320},
}
# Price per GB between tiers (the paper: 0.1-0.3), latency in ms, bandwidth in Gb/s.
LINKS = {("edge", "hub"): (0.1, 5.0, 1.0), ("hub", "cloud"): (0.15, 20.0, 10.0),
         ("edge", "cloud"): (0.25, 25.0, 1.0)}
HUB_BETWEEN = {"price_per_gb": 0.05, "latency_ms": 10.0, "bandwidth_gbps": 1.0}


def infrastructure(size, source_names, per_source_rate):
    spec = INFRA[size]
    tiers, workers = [], []
    names = [t[0] for t in spec["tiers"]]
    for name, locations, replicated, mix in spec["tiers"]:
        tier = {"name": name, "locations": locations}
        if replicated:
            tier["replicated"] = True
        elif locations > 1:
            tier["between_locations"] = HUB_BETWEEN
        tiers.append(tier)
        for location in range(1 if replicated else locations):
            for type_name, count in mix:
                entry = {"name": f"{name}{location}-{type_name}", "type": type_name,
                         "tier": name, "location": location}
                if count > 1:
                    entry["count"] = count
                workers.append(entry)
    network = []
    for i, a in enumerate(names):
        for b in names[i + 1:]:
            price, latency, bandwidth = LINKS[(a, b)]
            network.append({"from": a, "to": b, "price_per_gb": price, "latency_ms": latency,
                            "bandwidth_gbps": bandwidth})
    sources = [{"operator": s, "tier": "edge", "location": 0} for s in source_names]
    return {"tiers": tiers, "worker_types": worker_types(), "workers": workers,
            "network": network, "sources": sources}, per_source_rate


def profile(op, variant, worker_type, p50, p75, p90):
    return {"operator": op, "variant": variant, "worker_type": worker_type,
            "p50": round(p50, 3), "p75": round(p75, 3), "p90": round(p90, 3)}


# --- VQA: real JellyBean measurements -------------------------------------------------------
# The release's worker types mapped to the synthetic CPU sizes (by their price ratio 1:2:4:8,
# 24 for the cloud CPU) and the V100.
RELEASE_TYPE = {"cpu-2v": "workflow-compute-cpu-1", "cpu-4v": "workflow-compute-cpu-2",
                "cpu-8v": "workflow-compute-cpu-3", "cpu-16v": "workflow-compute-cpu-5",
                "cpu-32v": "workflow-compute-cpu-6", "v100": "workflow-compute-gpu-1"}


def read_release(raw):
    latency = {}
    for percentile in ("p50", "p75", "p90"):
        with open(os.path.join(raw, f"execution_profile_{percentile}.csv")) as f:
            for line in f:
                cells = [c for c in line.strip().split(",") if c]
                if len(cells) >= 4:
                    latency.setdefault((cells[0], cells[2], cells[1]), {})[percentile] = float(cells[3])
    accuracy = json.load(open(os.path.join(raw, "accuracy_profiles.json")))
    return latency, {e["op"]: e for e in accuracy["operators"]}


def vqa(size, raw):
    latency, accuracy = read_release(raw)
    rate = INFRA[size]["rate"]
    infra, _ = infrastructure(size, ["ReadImage", "ReadSpeech"], rate)
    image = list(accuracy["ExtractImageFeature"]["rows"].keys())
    speech = list(accuracy["SpeechRecognition"]["rows"].keys())
    profiles = []
    for op, variants in (("ExtractImageFeature", image), ("SpeechRecognition", speech),
                         ("VQA", ["default"])):
        for variant in variants:
            for synthetic, release in RELEASE_TYPE.items():
                values = latency[(op, variant, release)]
                profiles.append(profile(op, variant, synthetic, values["p50"], values["p75"],
                                        values["p90"]))
            values = latency[(op, variant, RELEASE_TYPE["v100"])]
            profiles.append(profile(op, variant, EDGE_GPU[0], *(EDGE_GPU[2] * values[p]
                                                                for p in ("p50", "p75", "p90"))))
    feature_kb = {"resnet18": 2.0039, "resnet34": 2.0039}
    return {
        "name": f"vqa-{size}",
        "description": (
            f"VQA-like workflow (image features + speech recognition -> question answering), "
            f"{size} infrastructure shaped after JellyBean's Table 5.4. Latencies and accuracies "
            f"are the real JellyBean release measurements (jellybean-vqa/raw, MIT licence) on the "
            f"release's worker types renamed by size (the edge GPU 't4' is synthetic: 1.8x the "
            f"V100's latency); prices, infrastructure and link delays are "
            f"synthetic. Generated by tools/placement/make_scenarios.py."),
        "workflow": {
            "operators": [
                {"name": "ReadImage", "kind": "source"},
                {"name": "ReadSpeech", "kind": "source"},
                {"name": "ExtractImageFeature", "kind": "ml", "variants": image},
                {"name": "SpeechRecognition", "kind": "ml", "variants": speech},
                {"name": "VQA", "kind": "ml", "variants": ["default"], "combine": "join"}],
            "edges": [
                {"from": "ReadImage", "to": "ExtractImageFeature", "message_kb": [{"kb": 794.03}]},
                {"from": "ReadSpeech", "to": "SpeechRecognition", "message_kb": [{"kb": 97.07}]},
                {"from": "ExtractImageFeature", "to": "VQA", "message_kb":
                    [{"from_variant": v, "kb": feature_kb.get(v, 8.0039)} for v in image]},
                {"from": "SpeechRecognition", "to": "VQA", "message_kb": [{"kb": 0.1}]}]},
        "accuracy_profiles": [
            {"operator": op, "inputs": accuracy[op]["inputs"],
             "variants": {v: [{"in": r["in"], "out": r["out"]} for r in rows]
                          for v, rows in accuracy[op]["rows"].items()}}
            for op in ("ExtractImageFeature", "SpeechRecognition", "VQA")],
        "execution_profiles": profiles,
        "infrastructure": infra,
        "objective": {"accuracy_target": 56.0, "input_rate": rate, "sink": "VQA"},
        "options": {"model_selection_beam": 10, "worker_assignment_beam": 10,
                    "topological_orders": 10, "latency_percentile": "p75"},
    }


# --- AICity: synthetic ------------------------------------------------------------------------
# Latency on the V100 (p75, ms) and how much slower each CPU size is, per model.
DETECTORS = {"yolov5s": (7.0, 0.50, 56.8), "yolov5m": (12.0, 0.62, 64.1),
             "yolov5l": (19.0, 0.70, 67.3)}  # (v100 ms, cpu penalty exponent, mAP@0.5)
REID = {"osnet-x0.25": (2.0, 0.40), "osnet-x1.0": (3.5, 0.55), "resnet50-reid": (6.0, 0.70)}
REID_GAIN = {"osnet-x0.25": 0.0, "osnet-x1.0": 4.0, "resnet50-reid": 6.5}
CPU_SLOWDOWN = {"cpu-2v": 24.0, "cpu-4v": 13.0, "cpu-8v": 7.0, "cpu-16v": 4.0, "cpu-32v": 2.6}


def aicity(size):
    rate = INFRA[size]["rate"] // 2
    infra, _ = infrastructure(size, ["Camera"], rate)
    profiles = []

    def add(op, variant, v100_ms, exponent):
        for type_name, _ in CPU_TYPES:
            slow = CPU_SLOWDOWN[type_name] * (1 + exponent) / 1.5
            p75 = v100_ms * slow
            profiles.append(profile(op, variant, type_name, p75 * 0.92, p75, p75 * 1.12))
        profiles.append(profile(op, variant, "v100", v100_ms * 0.95, v100_ms, v100_ms * 1.06))
        t4_ms = v100_ms * EDGE_GPU[2]
        profiles.append(profile(op, variant, EDGE_GPU[0], t4_ms * 0.95, t4_ms, t4_ms * 1.06))

    for name, (ms, exponent, _) in DETECTORS.items():
        add("Detect", name, ms, exponent)
    for name, (ms, exponent) in REID.items():
        add("ReId", name, ms, exponent)
    add("Track", "default", 0.8, 0.0)
    reid_rows = {}
    for name in REID:
        reid_rows[name] = [{"in": [m], "out": round(0.9 * m + 8.0 + REID_GAIN[name], 2)}
                           for _, (_, _, m) in DETECTORS.items()]
    return {
        "name": f"aicity-{size}",
        "description": (
            f"AICity-like multi-camera tracking (detection -> re-identification of ~3 crops per "
            f"frame -> tracking), {size} infrastructure shaped after JellyBean's Table 5.4. "
            f"Profiles are synthetic but plausible (YOLOv5-like detectors, OSNet/ResNet50 re-id, "
            f"DeepSORT-like tracking); accuracy is detection mAP@0.5 -> re-id IDF1-like score. "
            f"Generated by tools/placement/make_scenarios.py."),
        "workflow": {
            "operators": [
                {"name": "Camera", "kind": "source"},
                {"name": "Detect", "kind": "ml", "variants": list(DETECTORS)},
                {"name": "ReId", "kind": "ml", "variants": list(REID)},
                {"name": "Track", "kind": "relational"}],
            "edges": [
                {"from": "Camera", "to": "Detect", "message_kb": [{"kb": 250.0}]},
                {"from": "Detect", "to": "ReId", "rate_ratio": 3.0,
                 "message_kb": [{"kb": 24.0}]},
                {"from": "ReId", "to": "Track", "rate_ratio": 1.0,
                 "message_kb": [{"from_variant": "osnet-x0.25", "kb": 1.0},
                                {"from_variant": "osnet-x1.0", "kb": 2.0},
                                {"from_variant": "resnet50-reid", "kb": 8.0}]}]},
        "accuracy_profiles": [
            {"operator": "Detect", "inputs": [],
             "variants": {n: [{"in": [], "out": m}] for n, (_, _, m) in DETECTORS.items()}},
            {"operator": "ReId", "inputs": ["Detect"], "variants": reid_rows}],
        "execution_profiles": profiles,
        "infrastructure": infra,
        "objective": {"accuracy_target": 68.0, "input_rate": rate, "sink": "ReId"},
        "options": {"model_selection_beam": 10, "worker_assignment_beam": 10,
                    "topological_orders": 10, "latency_percentile": "p75"},
    }


def main():
    if len(sys.argv) != 2:
        sys.exit(__doc__)
    out = sys.argv[1]
    raw = os.path.join(out, "jellybean-vqa", "raw")
    for size in INFRA:
        for name, scenario in ((f"vqa-{size}", vqa(size, raw)), (f"aicity-{size}", aicity(size))):
            with open(os.path.join(out, f"{name}.json"), "w") as f:
                json.dump(scenario, f, indent=1)
                f.write("\n")


if __name__ == "__main__":
    main()
