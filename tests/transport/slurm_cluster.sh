#!/bin/sh
# A private one-node Slurm "cluster" for tests: munged, slurmctld and slurmd started from a
# temporary directory with their own key, socket, state and ports, so that the test can run real
# `srun` without touching the machine's configuration. Sourced by launchers.sh:
#   slurm_cluster_start DIR   exports SLURM_CONF; returns 77 (skip) when Slurm or munge is
#                             missing or we are not root, 1 (fail) when they are there but the
#                             daemons do not come up
#   slurm_cluster_stop DIR    kills exactly the daemons it started (by PID) and removes nothing
#                             else; safe to call twice
# Needs Debian's slurm-wlm (which brings munge).

slurm_free_port() {
  /usr/bin/python3 -c 'import socket; s=socket.socket(); s.bind(("127.0.0.1",0)); print(s.getsockname()[1])'
}

slurm_cluster_start() {
  dir=$1
  for tool in srun slurmctld slurmd munged mungekey; do
    if ! command -v $tool > /dev/null && [ ! -x /usr/sbin/$tool ]; then
      echo "SKIP: $tool is not installed (apt-get install slurm-wlm)"; return 77
    fi
  done
  if [ "$(id -u)" != 0 ]; then
    echo "SKIP: starting slurmd needs root here"; return 77
  fi
  PATH=$PATH:/usr/sbin
  mkdir -p "$dir/state" "$dir/spool"
  # From here on the tools are present and we may start them: a failure is the test's failure,
  # not a skip.
  mungekey -c -k "$dir/munge.key" > /dev/null 2>&1 || { echo "FAIL: mungekey failed"; return 1; }
  chmod 600 "$dir/munge.key"
  # --force: munged refuses root by default; the key and socket are private to this directory.
  munged --foreground --force --key-file "$dir/munge.key" --socket "$dir/munge.sock" \
    --pid-file "$dir/munged.pid" --log-file "$dir/munged.log" --seed-file "$dir/munge.seed" \
    > "$dir/munged.out" 2>&1 &
  echo $! > "$dir/munged.launch.pid"
  host=$(hostname -s)
  ctld_port=$(slurm_free_port) slurmd_port=$(slurm_free_port)
  cat > "$dir/slurm.conf" << EOF
ClusterName=plexustest
SlurmctldHost=$host(127.0.0.1)
AuthType=auth/munge
AuthInfo=socket=$dir/munge.sock
CredType=cred/munge
SlurmUser=root
SlurmdUser=root
SlurmctldPort=$ctld_port
SlurmdPort=$slurmd_port
StateSaveLocation=$dir/state
SlurmdSpoolDir=$dir/spool
SlurmctldPidFile=$dir/slurmctld.pid
SlurmdPidFile=$dir/slurmd.pid
SlurmctldLogFile=$dir/slurmctld.log
SlurmdLogFile=$dir/slurmd.log
ProctrackType=proctrack/linuxproc
TaskPlugin=task/none
SelectType=select/cons_tres
SelectTypeParameters=CR_Core
MpiDefault=none
ReturnToService=2
SchedulerType=sched/builtin
JobCompType=jobcomp/none
AccountingStorageType=accounting_storage/none
NodeName=$host NodeAddr=127.0.0.1 CPUs=$(nproc) State=UNKNOWN
PartitionName=test Nodes=ALL Default=YES MaxTime=INFINITE State=UP OverSubscribe=FORCE
EOF
  export SLURM_CONF="$dir/slurm.conf"
  i=0
  while [ ! -S "$dir/munge.sock" ] && [ $i -lt 50 ]; do sleep 0.1; i=$((i + 1)); done
  slurmctld -D -i -f "$SLURM_CONF" > "$dir/slurmctld.out" 2>&1 &
  echo $! > "$dir/slurmctld.launch.pid"
  slurmd -D -f "$SLURM_CONF" > "$dir/slurmd.out" 2>&1 &
  echo $! > "$dir/slurmd.launch.pid"
  i=0
  while [ $i -lt 100 ]; do
    if sinfo -h -o %t 2> /dev/null | grep -qx idle; then return 0; fi
    sleep 0.2
    i=$((i + 1))
  done
  echo "FAIL: the test's Slurm did not come up within 20 s:"
  tail -n 5 "$dir/slurmctld.log" "$dir/slurmd.log" 2> /dev/null
  slurm_cluster_stop "$dir"
  return 1
}

slurm_cluster_stop() {
  dir=$1
  for d in slurmd slurmctld munged; do
    if [ -f "$dir/$d.launch.pid" ]; then
      pid=$(cat "$dir/$d.launch.pid")
      kill "$pid" 2> /dev/null || true
      # A daemon that ignores SIGTERM is killed after 10 s; `wait` reaps it (no zombie).
      (sleep 10; kill -9 "$pid" 2> /dev/null) &
      watchdog=$!
      wait "$pid" 2> /dev/null || true
      kill "$watchdog" 2> /dev/null || true
      rm -f "$dir/$d.launch.pid"
    fi
  done
}
