#!/usr/bin/env bash
# vqa-medium served across network namespaces: edge and cloud joined by a veth pair shaped to the
# problem's edge -> cloud link (1 Gbit/s, times the compression, 5), one process per worker in its
# tier's namespace. Checks that every request is served once at the rate and that the shaped
# link carried at least the payload bytes the run reports from edge to cloud.
# Usage: bed_test.sh PLEXUS_SERVE PLEXUS_RUN SERVE_BED PROBLEM. Exit 77 (skip) without root.
set -euo pipefail
serve="$1" run="$2" bed="$3" problem="$4"
if [[ $(id -u) != 0 ]] || ! command -v ip > /dev/null || ! command -v tc > /dev/null; then
  echo "skipped: needs root, ip and tc (network namespaces, tc tbf)"
  exit 77
fi
if ! ip netns add "sbedprobe$$" 2> /dev/null; then
  echo "skipped: cannot create network namespaces here (no CAP_NET_ADMIN?)"
  exit 77
fi
ip netns del "sbedprobe$$"
name="sbed$$"
work=$(mktemp -d)
trap '"$bed" -n "$name" down; rm -rf "$work"' EXIT
# Plan time 5x the wall clock (3 wall s at 10x left 11 processes on 2 CPUs short of the rate in
# about one run of three).
"$serve" bed "$problem" --compression 5 > "$work/bed.txt"
"$bed" -n "$name" up "$work/bed.txt"
PLEXUS_RUN="$run" PLEXUS_SERVE="$serve" "$bed" -n "$name" run --timeout 100 -- \
  plan-and-run "$problem" --seconds 30 --compression 5 --no-spin --shaped-links \
  --report "$work/report.json"
"$bed" -n "$name" bytes | tee "$work/bytes.txt"
/usr/bin/python3 - "$work/report.json" "$work/bytes.txt" <<'PY'
import json, sys
r = json.load(open(sys.argv[1]))
q = r["requests"]
assert r["sustained"], r["throughput_ratio"]
assert q["dropped"] == 0 and q["duplicates"] == 0 and q["unfinished"] == 0, q
link = open(sys.argv[2]).read().split()  # link 1 0->1 BYTES 1->0 BYTES (place 0: edge)
carried = int(link[3])
payload = r["bytes_per_tier_pair"]["edge->cloud"]
assert carried >= payload, (carried, payload)
print(f"edge -> cloud link carried {carried} bytes; the run reports {payload:.0f} payload bytes "
      f"in its measured window")
PY
