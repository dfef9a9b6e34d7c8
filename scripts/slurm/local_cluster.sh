#!/usr/bin/env bash
# A one-node Slurm cluster on this machine, for trying and testing cohort's Slurm paths
# (scripts/slurm/train.sbatch, dist::initProcessGroup()'s Slurm detection) without a real cluster.
#   scripts/slurm/local_cluster.sh start [DIR]   # write DIR/slurm.conf, start slurmctld and slurmd
#   scripts/slurm/local_cluster.sh status [DIR]  # the daemons' pids and sinfo
#   scripts/slurm/local_cluster.sh stop [DIR]    # cancel the jobs, stop the daemons, remove DIR
#   export SLURM_CONF=DIR/slurm.conf             # then sbatch, srun, squeue... talk to it
# DIR defaults to $COHORT_SLURM_DIR, else /tmp/cohort-slurm. Everything the cluster keeps (its
# slurm.conf, state, spool, logs and pid files) is under DIR; nothing is written to /etc, no system
# service is started and no munged is needed (AuthType=auth/none: fine on one machine, never on a
# real cluster). The node is this host's short name (`hostname -s`) with every CPU and a small
# memory, reached on 127.0.0.1; the daemons listen on two free ports found at start.
# Needs Debian's slurmctld, slurmd and slurm-client (the munge package comes along as a
# dependency but is not used), and root: slurmd starts every job's tasks as the submitting user.
# Exit codes: 0 done; 1 the daemons did not come up or go down (their logs are printed);
# 2 usage; 3 Slurm is not installed or this is not root (nothing was started).
# The daemons carry COHORT_LOCAL_SLURM=DIR in their environment and work in DIR/log, as the
# slurmstepd processes of their jobs do: that is how `stop` finds them and only them.
set -euo pipefail

usage() {
  echo "usage: $0 start|stop|status [DIR]" >&2
  exit 2
}
[[ $# -ge 1 && $# -le 2 ]] || usage
action=$1
dir=${2:-${COHORT_SLURM_DIR:-/tmp/cohort-slurm}}
[[ $dir == /* ]] || dir=$PWD/$dir
conf=$dir/slurm.conf
# Seconds to wait for the node to turn idle at start and for the daemons to exit at stop.
start_timeout=${COHORT_SLURM_START_TIMEOUT:-60}
stop_timeout=${COHORT_SLURM_STOP_TIMEOUT:-10}

log() { echo "local_cluster: $*" >&2; }

# The pids of this cluster's processes: those whose environment holds COHORT_LOCAL_SLURM=$dir
# (the daemons), and Slurm's own processes working in $dir (the daemons chdir to their log
# directory, and slurmd's slurmstepd processes, which do not inherit its environment, with them).
# One grep over every environ file: spawning a reader per process would take seconds.
cluster_pids() {
  local f p c cwd
  {
    for f in $(grep -lzxF "COHORT_LOCAL_SLURM=$dir" /proc/[0-9]*/environ 2>/dev/null || true); do
      p=${f#/proc/}
      echo "${p%/environ}"
    done
    for p in $(for c in slurmctld slurmscriptd slurmd slurmstepd; do pgrep -x "$c"; done || true); do
      cwd=$(readlink "/proc/$p/cwd" 2>/dev/null || true)
      [[ $cwd == "$dir" || $cwd == "$dir"/* ]] && echo "$p"
    done
  } | sort -un | grep -vxF -e "$$" -e "$BASHPID" || true
}

# The pids given and all their descendants (a job's tasks are children of its slurmstepd).
with_descendants() {
  local -A children=()
  local pid ppid
  while read -r pid ppid; do children[$ppid]+="$pid "; done < <(ps -e -o pid=,ppid=)
  local queue=("$@") out=()
  while ((${#queue[@]})); do
    pid=${queue[0]}
    queue=("${queue[@]:1}")
    out+=("$pid")
    # shellcheck disable=SC2206
    queue+=(${children[$pid]:-})
  done
  if ((${#out[@]})); then printf '%s\n' "${out[@]}" | sort -un; fi
}

# Whether any of the pids still runs (a zombie does not).
any_alive() {
  local p
  for p in "$@"; do
    if [[ -e /proc/$p ]] && ! grep -q '^State:.*[ZX]' "/proc/$p/status" 2>/dev/null; then return 0; fi
  done
  return 1
}

# A TCP port on 127.0.0.1 that nothing listens on, from $1 upwards, other than $2.
free_port() {
  local p=$1
  while ((p < 65000)); do
    if [[ $p != "${2:-}" ]] && ! (: </dev/tcp/127.0.0.1/"$p") 2>/dev/null; then
      echo "$p"
      return
    fi
    p=$((p + 1))
  done
  log "no free port from $1 up"
  return 1
}

show_logs() {
  local f
  for f in "$dir"/log/slurmctld.log "$dir"/log/slurmd.log; do
    [[ -f $f ]] || continue
    echo "---- last lines of $f" >&2
    tail -n 25 "$f" >&2
  done
}

stop_cluster() {
  export SLURM_CONF=$conf
  local pids deadline
  pids=$(cluster_pids)
  if [[ -n $pids && -f $conf ]] && command -v scancel >/dev/null; then
    # Jobs first, so that the steps end their tasks (and run their cleanup) before slurmd goes.
    if timeout 5 scancel --quiet --full --user "$(id -un)" 2>/dev/null; then
      deadline=$((SECONDS + 10))
      while ((SECONDS < deadline)) && [[ -n $(timeout 5 squeue -h -o %i 2>/dev/null || true) ]]; do sleep 0.2; done
    fi
  fi
  # The daemons, their steps and whatever those still run (when the controller could not cancel).
  # shellcheck disable=SC2046
  pids=$(with_descendants $(cluster_pids))
  if [[ -n $pids ]]; then
    # shellcheck disable=SC2086
    kill -TERM $pids 2>/dev/null || true
    deadline=$((SECONDS + stop_timeout))
    # shellcheck disable=SC2086
    while ((SECONDS < deadline)) && any_alive $pids; do sleep 0.1; done
    # shellcheck disable=SC2086
    if any_alive $pids; then
      log "still running after ${stop_timeout} s, killing: $(tr '\n' ' ' <<<"$pids")"
      # shellcheck disable=SC2086
      kill -KILL $pids 2>/dev/null || true
      sleep 0.5
    fi
  fi
  pids=$(cluster_pids)
  # shellcheck disable=SC2086
  if [[ -n $pids ]] && any_alive $pids; then
    log "cannot stop the cluster in $dir: processes $(tr '\n' ' ' <<<"$pids")remain"
    return 1
  fi
  # Only a directory this script made (it holds the marker file) is removed.
  if [[ -f $dir/.cohort_local_slurm ]]; then rm -rf "$dir"; fi
}

start_cluster() {
  local missing=()
  for c in slurmctld slurmd sinfo sbatch srun squeue scancel scontrol; do
    command -v "$c" >/dev/null || missing+=("$c")
  done
  if ((${#missing[@]})); then
    log "Slurm is not installed (missing: ${missing[*]}); on Debian: apt-get install slurmctld slurmd slurm-client"
    exit 3
  fi
  if [[ $(id -u) -ne 0 ]]; then
    log "needs root (slurmd starts the tasks as the job's user)"
    exit 3
  fi
  if [[ -n $(cluster_pids) ]]; then
    log "a cluster already runs in $dir; stop it first ($0 stop $dir)"
    exit 1
  fi
  if [[ -e $dir && ! -f $dir/.cohort_local_slurm ]] && [[ -n $(ls -A "$dir") ]]; then
    log "$dir exists and is not empty; pick another directory"
    exit 2
  fi
  rm -rf "$dir"
  mkdir -p "$dir"/state "$dir"/spool "$dir"/log "$dir"/run
  touch "$dir/.cohort_local_slurm"
  chmod 755 "$dir"

  local host cpus ctld_port slurmd_port
  host=$(hostname -s)
  mkdir -p "$dir/spool/slurmd-$host"
  cpus=$(nproc)
  ctld_port=$(free_port 16817)
  slurmd_port=$(free_port $((ctld_port + 1)) "$ctld_port")
  local first_job_id=$((1000 + RANDOM % 9000))
  cat >"$conf" <<EOF
# Written by scripts/slurm/local_cluster.sh: a one-node cluster for tests, in $dir.
ClusterName=cohort-local
SlurmctldHost=$host(127.0.0.1)
SlurmctldPort=$ctld_port
SlurmdPort=$slurmd_port
SlurmUser=root
SlurmdUser=root
AuthType=auth/none
CredType=cred/none
StateSaveLocation=$dir/state
SlurmdSpoolDir=$dir/spool/slurmd-%n
SlurmctldPidFile=$dir/run/slurmctld.pid
SlurmdPidFile=$dir/run/slurmd-%n.pid
SlurmctldLogFile=$dir/log/slurmctld.log
SlurmdLogFile=$dir/log/slurmd.log
SlurmctldDebug=info
SlurmdDebug=info
ProctrackType=proctrack/linuxproc
TaskPlugin=task/none
JobAcctGatherType=jobacct_gather/none
AccountingStorageType=accounting_storage/none
JobCompType=jobcomp/none
SwitchType=switch/none
MpiDefault=none
SelectType=select/cons_tres
SelectTypeParameters=CR_Core
SchedulerType=sched/backfill
ReturnToService=2
# Job ids start at a random point: the store port cohort derives from the job id (20000 + id mod
# 10000) then differs between clusters started side by side (two test runs at once).
FirstJobId=$first_job_id
# scancel: SIGTERM, then SIGKILL after KillWait seconds.
KillWait=5
MinJobAge=60
SlurmctldTimeout=30
SlurmdTimeout=30
InactiveLimit=0
MailProg=/bin/true
NodeName=$host NodeAddr=127.0.0.1 NodeHostname=$host CPUs=$cpus RealMemory=1000 State=UNKNOWN
PartitionName=debug Nodes=$host Default=YES MaxTime=INFINITE State=UP
EOF
  export SLURM_CONF=$conf
  log "starting slurmctld (port $ctld_port) and slurmd (port $slurmd_port) for node $host ($cpus CPUs) in $dir"
  # -c: no state from an earlier run. Both daemonize; the marker finds them (and their steps) later.
  if ! COHORT_LOCAL_SLURM=$dir slurmctld -c -f "$conf" >"$dir/log/slurmctld.out" 2>&1; then
    log "slurmctld failed to start"
    cat "$dir/log/slurmctld.out" >&2
    show_logs
    stop_cluster || true
    exit 1
  fi
  if ! COHORT_LOCAL_SLURM=$dir slurmd -f "$conf" -N "$host" >"$dir/log/slurmd.out" 2>&1; then
    log "slurmd failed to start"
    cat "$dir/log/slurmd.out" >&2
    show_logs
    stop_cluster || true
    exit 1
  fi
  local deadline=$((SECONDS + start_timeout)) state=""
  while ((SECONDS < deadline)); do
    state=$(timeout 5 sinfo -h -N -n "$host" -o %t 2>/dev/null || true)
    [[ $state == idle ]] && break
    sleep 0.5
  done
  if [[ $state != idle ]]; then
    log "node $host is not idle after ${start_timeout} s (state: '${state:-no answer from slurmctld}')"
    show_logs
    stop_cluster || true
    exit 1
  fi
  log "up: node $host idle; export SLURM_CONF=$conf"
}

status_cluster() {
  local pids
  pids=$(cluster_pids)
  if [[ -z $pids ]]; then
    echo "no cluster runs in $dir"
    return 1
  fi
  echo "cluster in $dir: processes $(tr '\n' ' ' <<<"$pids")"
  SLURM_CONF=$conf timeout 10 sinfo -N -l || true
  SLURM_CONF=$conf timeout 10 squeue || true
}

case $action in
  start) start_cluster ;;
  stop) stop_cluster ;;
  status) status_cluster ;;
  *) usage ;;
esac
