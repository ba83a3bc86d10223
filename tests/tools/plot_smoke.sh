#!/bin/sh
# Draws every picture plexus-plot knows from real tool output and checks each is a PNG; also
# checks that bad input gets a message and status 2. Skips (77) without python3-matplotlib.
# Usage: plot_smoke.sh PLEXUS_PLOT PLEXUS_PLACE PLEXUS_MOE DATA_DIR WORK_DIR
set -eu
plot=$1 place=$2 moe=$3 data=$4 work=$5
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
"$plot" placement "$work/place.json" -o "$work/place.png" && is_png "$work/place.png"
"$plot" recovery "$work"/recovery*.json -o "$work/recovery.png" && is_png "$work/recovery.png"
"$plot" timeline "$work/simulate.json" -o "$work/timeline.png" && is_png "$work/timeline.png"
# A figure line of each benchmark kind, as the benches print them.
cat > "$work/collectives.jsonl" <<'J'
{"bench":"collectives","figure":"allreduce busbw","impl":"plexus","op":"allreduce","transport":"tcp","nprocs":2,"bytes":1024,"busbw":0.5,"value":0.5,"unit":"GB/s"}
{"bench":"collectives","figure":"allreduce busbw","impl":"plexus","op":"allreduce","transport":"tcp","nprocs":2,"bytes":2048,"busbw":0.9,"value":0.9,"unit":"GB/s"}
{"bench":"collectives","figure":"allreduce busbw","impl":"openmpi","op":"allreduce","transport":"tcp","nprocs":2,"bytes":1024,"busbw":0.4,"value":0.4,"unit":"GB/s"}
J
# plexus-rpc-sim sweep --json lines (two policies, two loads).
cat > "$work/rpc_balance_sim.jsonl" <<'J'
{"bench":"rpc_balance_sim","figure":"p99","value":425.4,"unit":"us","policy":"random","load":0.7,"service":"exp"}
{"bench":"rpc_balance_sim","figure":"p99","value":631.6,"unit":"us","policy":"random","load":0.8,"service":"exp"}
{"bench":"rpc_balance_sim","figure":"p99","value":221.7,"unit":"us","policy":"daronpon","load":0.7,"service":"exp"}
{"bench":"rpc_balance_sim","figure":"p99","value":249.1,"unit":"us","policy":"daronpon","load":0.8,"service":"exp"}
J
"$plot" p99 "$work/rpc_balance_sim.jsonl" -o "$work/p99.png" && is_png "$work/p99.png"
"$plot" report "$work" && is_png "$work/collectives.png" && is_png "$work/rpc_balance_sim.png"
grep -q '| allreduce busbw | 0.5 | GB/s' "$work/report.md" || { echo "report.md lacks the table"; exit 1; }
# Bad input: a clear message and status 2, never a traceback.
echo 'not json' > "$work/bad.jsonl"
set +e
"$plot" busbw "$work/bad.jsonl" -o "$work/bad.png" 2> "$work/err.txt"; rc=$?
set -e
[ $rc = 2 ] && grep -q 'bad.jsonl:1: not JSON' "$work/err.txt" || { cat "$work/err.txt"; exit 1; }
! grep -q Traceback "$work/err.txt"
echo "plot smoke: every picture written"
