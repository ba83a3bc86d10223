#!/bin/sh
# Draws every picture plexus-plot knows from real tool output and checks each is a PNG (each
# command on its own line: `set -e` does not stop on the left side of `&&`); also
# checks that bad input gets a message and status 2. Skips (77) without python3-matplotlib.
# Usage: plot_smoke.sh PLEXUS_PLOT PLEXUS_PLACE PLEXUS_MOE DATA_DIR WORK_DIR [PLEXUS_MCCS_SIM]
set -eu
plot=$1 place=$2 moe=$3 data=$4 work=$5 mccs=${6:-}
here=$(cd "$(dirname "$0")" && pwd)
if ! /usr/bin/python3 -c 'import matplotlib' 2>/dev/null; then
  echo "SKIP: python3-matplotlib is not installed (make deps installs it)"
  exit 77
fi
rm -rf "$work" && mkdir -p "$work"
is_png() { [ "$(head -c 4 "$1" | od -An -c | tr -d ' \n')" = "211PNG" ] || { echo "not a PNG: $1"; exit 1; }; }
"$place" compare --json "$data/placement/vqa-medium.json" > "$work/place.json"
for k in 1 2 3; do
  "$moe" recovery --scenario "$data/moe/gpt-s.json" --failures $k --json \
    > "$work/recovery$k.json"
done
"$moe" simulate --scenario "$data/moe/gpt-s.json" \
  --schedule "$data/moe/fail-every-5min.json" --system lazarus --json > "$work/simulate.json" 2>/dev/null
"$plot" placement "$work/place.json" -o "$work/place.png"
is_png "$work/place.png"
"$plot" recovery "$work"/recovery*.json -o "$work/recovery.png"
is_png "$work/recovery.png"
"$plot" timeline "$work/simulate.json" -o "$work/timeline.png"
is_png "$work/timeline.png"
# plexus-moe-demo --json's summary (a real run's, series thinned): a kill and a join in each run.
cat > "$work/demo.json" <<'J'
{"checkpoint_every": 10, "checkpoint_restart": {"digest": "1595e6a690d09563", "failure": {"checkpoint_restart": true, "detect_s": 0.20672906, "error": "allgather #222 (count 6, i64, halving_doubling) failed on rank 0: rank 1 died or is unreachable (connection failed: shm: peer process 3198 ('shm-peer-pid-3198') disconnected: it closed or died) [connections down: rank 1, rank 2 (closed its connection)]", "event": "failure", "experts_fetched": 0, "members": [0, 2, 3], "recovery_s": 0.501634154, "samples": 10240, "step": 20, "steps_lost": 0, "t": 0.891432412}, "join": {"checkpoint_restart": true, "event": "join", "experts_fetched": 0, "join_s": 0.006621336, "joined": [4], "members": [0, 2, 3, 4], "samples": 16384, "step": 31, "t": 0.995028574}, "seconds": 1.069933281, "series": [[0.028000981, 512], [0.089393276, 4608], [0.157916909, 8704], [0.934850946, 12800], [1.005197049, 16896]], "time_lost_s": 0.721342665}, "elastic": {"digest": "1595e6a690d09563", "failure": {"checkpoint_restart": false, "detect_s": 0.216052578, "error": "allgather #222 (count 6, i64, halving_doubling) failed on rank 0: rank 1 died or is unreachable (connection failed: shm: peer process 3186 ('shm-peer-pid-3186') disconnected: it closed or died) [connections down: rank 1, rank 2 (closed its connection), rank 3 (closed its connection)]", "event": "failure", "experts_fetched": 12, "members": [2, 0, 3], "recovery_s": 0.491202634, "samples": 10240, "step": 20, "steps_lost": 0, "t": 0.900688612}, "join": {"checkpoint_restart": false, "event": "join", "experts_fetched": 8, "join_s": 0.006756422, "joined": [4], "members": [0, 3, 2, 4], "samples": 15872, "step": 30, "t": 0.978728367}, "seconds": 1.078153054, "series": [[0.033346564, 512], [0.107189674, 4608], [0.170035447, 8704], [0.927602806, 12800], [1.001040263, 16896]], "time_lost_s": 0.712771165}, "kill_rank": 1, "kill_step": 20, "never_failed_digest": "1595e6a690d09563", "ranks": 4, "same_parameters": true, "steps": 40, "time_lost_ratio": 1.0120255987067042, "tokens_per_step": 512}
J
"$plot" demo "$work/demo.json" -o "$work/demo.png"
is_png "$work/demo.png"
# A figure line of each benchmark kind, as the benches print them.
cat > "$work/collectives.jsonl" <<'J'
{"bench":"collectives","figure":"allreduce busbw","impl":"plexus","op":"allreduce","transport":"tcp","nprocs":2,"bytes":1024,"busbw":0.5,"value":0.5,"unit":"GB/s"}
{"bench":"collectives","figure":"allreduce busbw","impl":"plexus","op":"allreduce","transport":"tcp","nprocs":2,"bytes":2048,"busbw":0.9,"value":0.9,"unit":"GB/s"}
{"bench":"collectives","figure":"allreduce busbw","impl":"openmpi","op":"allreduce","transport":"tcp","nprocs":2,"bytes":1024,"busbw":0.4,"value":0.4,"unit":"GB/s"}
{"bench":"collectives","figure":"broadcast busbw","impl":"plexus","op":"broadcast","transport":"shm","nprocs":4,"bytes":1024,"busbw":0.7,"value":0.7,"unit":"GB/s"}
{"bench":"collectives","figure":"broadcast busbw","impl":"openmpi","op":"broadcast","transport":"shm","nprocs":4,"bytes":1024,"busbw":0.6,"value":0.6,"unit":"GB/s"}
{"bench":"collectives","figure":"reduce busbw","impl":"plexus","op":"reduce","transport":"shm","nprocs":4,"bytes":1024,"busbw":0.3,"value":0.3,"unit":"GB/s","vs_best_peer":0.5,"target":0.6,"met":false}
{"bench":"collectives","figure":"reduce busbw","impl":"openmpi","op":"reduce","transport":"shm","nprocs":4,"bytes":1024,"busbw":0.6,"value":0.6,"unit":"GB/s"}
J
# plexus-rpc-sim sweep --json lines (two policies, two loads).
cat > "$work/rpc_balance_sim.jsonl" <<'J'
{"bench":"rpc_balance_sim","figure":"p99","value":425.4,"unit":"us","policy":"random","load":0.7,"service":"exp"}
{"bench":"rpc_balance_sim","figure":"p99","value":631.6,"unit":"us","policy":"random","load":0.8,"service":"exp"}
{"bench":"rpc_balance_sim","figure":"p99","value":221.7,"unit":"us","policy":"daronpon","load":0.7,"service":"exp"}
{"bench":"rpc_balance_sim","figure":"p99","value":249.1,"unit":"us","policy":"daronpon","load":0.8,"service":"exp"}
J
"$plot" p99 "$work/rpc_balance_sim.jsonl" -o "$work/p99.png"
is_png "$work/p99.png"
# The flow simulator's two pictures, from small real runs of plexus-mccs-sim.
if [ -n "$mccs" ]; then
  "$mccs" table --leaves 4 --spines 4 --hosts-per-leaf 2 --nics 4 --job-sizes 8 --runs 1 --json \
    > "$work/mccs_sim.jsonl"
  "$mccs" spread --pods 2 --racks 2 --hosts 4 --orders 50 --correlation-orders 10 \
    --reorder-seconds 5 --json > "$work/cc_spread.jsonl"
  "$plot" mccs "$work/mccs_sim.jsonl" -o "$work/mccs.png"
  is_png "$work/mccs.png"
  "$plot" spread "$work/cc_spread.jsonl" -o "$work/spread.png"
  is_png "$work/spread.png"
fi
# plexus-bench-multipath --timeline --json: a real run's series (tests/tools/multipath_timeline.jsonl),
# Plexus and MPTCP through a link-down and a restore of path 2.
"$plot" failover "$here/multipath_timeline.jsonl" -o "$work/failover.png"
is_png "$work/failover.png"
cp "$here/multipath_timeline.jsonl" "$work/multipath.jsonl"
"$plot" report "$work"
is_png "$work/collectives.png"
is_png "$work/collectives-vs-peer.png"
is_png "$work/rpc_balance_sim.png"
grep -q '| allreduce busbw | 0.5 | GB/s' "$work/report.md" || { echo "report.md lacks the table"; exit 1; }
# The multipath timeline is drawn; its summary lines are in the table, its samples are not.
is_png "$work/multipath.png"
grep -q '| timeline_outage |' "$work/report.md" || { echo "report.md lacks timeline_outage"; exit 1; }
! grep -q '| timeline |' "$work/report.md" || { echo "report.md lists timeline samples"; exit 1; }
# Collectives traces (PLEXUS_COLL_TRACE's files from a real 4-rank run of the trace_timeline
# example): one lane per rank.
"$plot" timeline "$here"/coll_trace.*.json -o "$work/coll_trace.png" --merged "$work/merged.json"
is_png "$work/coll_trace.png"
# The merged Chrome trace holds every rank's process lane.
/usr/bin/python3 -c 'import json, sys; d = json.load(open(sys.argv[1])); \
assert sorted({e["pid"] for e in d["traceEvents"]}) == [0, 1, 2, 3], "ranks missing"' \
  "$work/merged.json"
set +e
"$plot" timeline "$here/coll_trace.0.json" "$work/rpc_balance_sim.jsonl" -o "$work/bad.png" \
  2> "$work/err.txt"; rc=$?
set -e
[ $rc = 2 ] && grep -q 'not a collectives trace' "$work/err.txt" || { cat "$work/err.txt"; exit 1; }
# Bad input: a clear message and status 2, never a traceback.
echo 'not json' > "$work/bad.jsonl"
set +e
"$plot" busbw "$work/bad.jsonl" -o "$work/bad.png" 2> "$work/err.txt"; rc=$?
set -e
[ $rc = 2 ] && grep -q 'bad.jsonl:1: not JSON' "$work/err.txt" || { cat "$work/err.txt"; exit 1; }
# (`! cmd` never stops a `set -e` script: test it explicitly.)
if grep -q Traceback "$work/err.txt"; then cat "$work/err.txt"; echo "a traceback"; exit 1; fi
# A file without timeline lines: the failover picture says what it needs.
set +e
"$plot" failover "$work/rpc_balance_sim.jsonl" -o "$work/bad.png" 2> "$work/err.txt"; rc=$?
set -e
[ $rc = 2 ] && grep -q 'no multipath timeline records' "$work/err.txt" || { cat "$work/err.txt"; exit 1; }
# Plexus against its peers: the grid of ratios, and what it needs when they are missing.
"$plot" vs-peer "$work/collectives.jsonl" -o "$work/vs-peer.png"
is_png "$work/vs-peer.png"
set +e
"$plot" vs-peer "$work/rpc_balance_sim.jsonl" -o "$work/bad.png" 2> "$work/err.txt"; rc=$?
set -e
[ $rc = 2 ] && grep -q 'collectives lines of Plexus with a peer' "$work/err.txt" || { cat "$work/err.txt"; exit 1; }
echo "plot smoke: every picture written"
