#!/bin/sh
# Starts tests/transport/launch_probe unchanged under a real launcher, with none of the PLEXUS_*
# or torch variables inherited from the caller, and checks that every rank printed its line with
# the exact sum of the hand-made allreduce. Exit 77 (skipped) when the launcher is not installed.
# Usage: launchers.sh none|mpirun|srun|torchrun|plexus-run PROBE RANKS [PLEXUS_RUN]
# srun starts a private one-node Slurm for the test (slurm_cluster.sh) and stops it after.
set -eu
mode=$1 probe=$2 n=$3 plexus_run=${4:-}
limit=90  # seconds for the whole launch; ctest's TIMEOUT is above it

for v in $(env | sed -n 's/^\(PLEXUS_[A-Z0-9_]*\)=.*/\1/p; s/^\(OMPI_[A-Z0-9_]*\)=.*/\1/p;
                          s/^\(PMIX_[A-Z0-9_]*\)=.*/\1/p; s/^\(SLURM_[A-Z0-9_]*\)=.*/\1/p;
                          s/^\(TORCHELASTIC_[A-Z0-9_]*\)=.*/\1/p'); do
  unset "$v"
done
unset RANK WORLD_SIZE LOCAL_RANK LOCAL_WORLD_SIZE MASTER_ADDR MASTER_PORT 2>/dev/null || true

work=$(mktemp -d "${TMPDIR:-/tmp}/plexus-launchers.XXXXXX")
trap 'rm -rf "$work"' EXIT
out=$work/out

case $mode in
  none)
    launcher=none store=tcp
    timeout -k 5 $limit "$probe" > "$out"
    ;;
  plexus-run)
    launcher=plexus store=tcp
    # plexus-run prefixes every line with "[rank] ".
    timeout -k 5 $limit "$plexus_run" -n "$n" "$probe" > "$work/raw"
    sed -n 's/^\[[0-9]*\] //p' "$work/raw" > "$out"
    ;;
  mpirun)
    if ! command -v mpirun > /dev/null; then
      echo "SKIP: mpirun is not installed (openmpi-bin)"; exit 77
    fi
    launcher="Open MPI" store=pmix
    # Test-only settings: root may run it here (CI), more ranks than cores, no pinning, and
    # only loopback for Open MPI's own out-of-band traffic.
    export OMPI_ALLOW_RUN_AS_ROOT=1 OMPI_ALLOW_RUN_AS_ROOT_CONFIRM=1
    export OMPI_MCA_rmaps_base_oversubscribe=1 OMPI_MCA_hwloc_base_binding_policy=none
    export OMPI_MCA_oob_tcp_if_include=lo OMPI_MCA_btl_tcp_if_include=lo
    timeout -k 5 $limit mpirun -np "$n" "$probe" > "$out"
    ;;
  srun)
    . "$(dirname "$0")/slurm_cluster.sh"
    rc=0
    slurm_cluster_start "$work/slurm" || rc=$?
    [ $rc = 0 ] || exit $rc
    trap 'slurm_cluster_stop "$work/slurm"; rm -rf "$work"' EXIT
    launcher=Slurm store=pmix
    timeout -k 5 $limit srun -n "$n" --overcommit --mpi=pmix "$probe" > "$out"
    # Without --mpi=pmix srun serves no key-value exchange: each rank must say what to do.
    if timeout -k 5 $limit srun -n "$n" --overcommit "$probe" > "$work/nopmix" 2>&1; then
      echo "FAIL: srun without --mpi=pmix succeeded"; cat "$work/nopmix"; exit 1
    fi
    if [ "$(grep -c 'run srun --mpi=pmix' "$work/nopmix")" != "$n" ]; then
      echo "FAIL: every rank should name --mpi=pmix when srun serves no PMIx:"; cat "$work/nopmix"
      exit 1
    fi
    ;;
  torchrun)
    if ! /usr/bin/python3 -c 'import torch.distributed.run' 2> /dev/null; then
      echo "SKIP: python3-torch is not installed (torchrun comes with it)"; exit 77
    fi
    launcher=torchrun store=torch
    port=$(/usr/bin/python3 -c 'import socket; s=socket.socket(); s.bind(("127.0.0.1",0)); print(s.getsockname()[1])')
    # Debian's torchrun 1.13 on Python 3.11 rejects the default --redirects/--tee 0 (and 3), so
    # stdout goes through --tee 1, whose lines carry a "[default<rank>]:" prefix.
    timeout -k 5 $limit /usr/bin/python3 -m torch.distributed.run --nproc_per_node "$n" \
      --monitor_interval 0.5 \
      --master_addr 127.0.0.1 --master_port "$port" --redirects 1 --tee 1 \
      --log_dir "$work/logs" --no_python "$probe" > "$work/raw"
    sed -n 's/^\[default[0-9]*\]://p' "$work/raw" > "$out"
    ;;
  *)
    echo "unknown mode $mode"; exit 2
    ;;
esac

cat "$out"
status=0
r=0
while [ $r -lt "$n" ]; do
  expected=0
  p=0
  while [ $p -lt "$n" ]; do
    [ $p -ne $r ] && expected=$((expected + (p + 1) * 1000 + r))
    p=$((p + 1))
  done
  line="launch_probe rank $r of $n launcher $launcher store $store sum $expected expected $expected ok"
  if [ "$(grep -cxF "$line" "$out")" != 1 ]; then
    echo "FAIL: missing or repeated line: $line"
    status=1
  fi
  r=$((r + 1))
done
[ "$(grep -c '^launch_probe' "$out")" = "$n" ] || { echo "FAIL: expected $n probe lines"; status=1; }
exit $status
