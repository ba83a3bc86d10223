#!/usr/bin/env bash
# plexus-serve as one job under mpirun or torchrun: rank 0 drives, the other ranks host the
# workers; aicity-medium for 20 plan s must be served exactly and at the rate.
# Usage: launchers_test.sh mpirun|torchrun PLEXUS_SERVE PROBLEM. Exit 77 (skip) without the launcher.
set -euo pipefail
mode="$1" serve="$2" problem="$3"
work=$(mktemp -d)
trap 'rm -rf "$work"' EXIT
args=(plan-and-run "$problem" --seconds 20 --no-spin)
case "$mode" in
  mpirun)
    command -v mpirun > /dev/null || { echo "SKIP: mpirun (Open MPI) is not installed"; exit 77; }
    root=()
    [[ $(id -u) == 0 ]] && root=(--allow-run-as-root)
    timeout -k 5 100 mpirun "${root[@]}" --oversubscribe -n 4 "$serve" "${args[@]}" > "$work/out" 2>&1
    ;;
  torchrun)
    if ! /usr/bin/python3 -c 'import torch.distributed.run' 2> /dev/null; then
      echo "SKIP: python3-torch is not installed (torchrun comes with it)"; exit 77
    fi
    port=$(/usr/bin/python3 -c 'import socket; s=socket.socket(); s.bind(("127.0.0.1",0)); print(s.getsockname()[1])')
    # Debian's torchrun 1.13 on Python 3.11 needs non-zero --redirects/--tee.
    timeout -k 5 100 /usr/bin/python3 -m torch.distributed.run --nproc_per_node 4 \
      --monitor_interval 0.5 --master_addr 127.0.0.1 --master_port "$port" --redirects 1 --tee 1 \
      --log_dir "$work/logs" --no_python "$serve" "${args[@]}" > "$work/out" 2>&1
    ;;
  *) echo "unknown mode $mode"; exit 2 ;;
esac
cat "$work/out" | grep -v ' t=' || true
grep -q "3 host processes: serving over tcp" "$work/out"
grep -q "sustained: yes" "$work/out"
grep -q "messages at the sinks: 1200 completed, 0 dropped, 0 duplicated, 0 unfinished" "$work/out"
echo "PASS: $mode"
