# A real single-node Slurm (munge, slurmctld, slurmd) in a scratch directory, for tests.
# Needs root and Debian's munge slurmctld slurmd slurm-client (scripts/install-deps.sh).
#   source slurm_env.sh; slurm_up /tmp/slurm; ...srun...; slurm_down /tmp/slurm
# Why the settings: without cgroups proctrack/cgroup fails every task while srun still exits 0,
# hence proctrack/linuxproc and task/none; CPUs=8 with SlurmdParameters=config_overrides lets
# more tasks than cores start (else a job pends forever); slurmctld must answer
# `scontrol ping` before slurmd starts, and the node must read idle before use.

slurm_up() {  # slurm_up DIR: starts the daemons; returns when the node is idle (bounded)
  local dir=$1 host
  host=$(hostname -s)
  mkdir -p "$dir"/{state,spool,log}
  mkdir -p /run/munge && chown munge:munge /run/munge
  if ! munge -n 2>/dev/null | unmunge >/dev/null 2>&1; then
    runuser -u munge -- /usr/sbin/munged || return 1
  fi
  cat > "$dir/slurm.conf" <<EOF
ClusterName=rlxtest
SlurmctldHost=$host(127.0.0.1)
SlurmUser=root
SlurmdUser=root
AuthType=auth/munge
ProctrackType=proctrack/linuxproc
TaskPlugin=task/none
SelectType=select/cons_tres
SelectTypeParameters=CR_Core
MpiDefault=none
MailProg=/bin/true
AccountingStorageType=accounting_storage/none
JobAcctGatherType=jobacct_gather/none
JobCompType=jobcomp/none
SlurmdParameters=config_overrides
ReturnToService=2
StateSaveLocation=$dir/state
SlurmdSpoolDir=$dir/spool
SlurmctldLogFile=$dir/log/slurmctld.log
SlurmdLogFile=$dir/log/slurmd.log
SlurmctldPidFile=$dir/slurmctld.pid
SlurmdPidFile=$dir/slurmd.pid
SlurmctldPort=16817
SlurmdPort=16818
NodeName=$host NodeAddr=127.0.0.1 CPUs=8 State=UNKNOWN
PartitionName=test Nodes=$host Default=YES MaxTime=INFINITE State=UP OverSubscribe=YES
EOF
  export SLURM_CONF=$dir/slurm.conf
  /usr/sbin/slurmctld -f "$SLURM_CONF" || return 1
  for _ in $(seq 1 100); do scontrol ping 2>/dev/null | grep -q UP && break; sleep 0.1; done
  /usr/sbin/slurmd -f "$SLURM_CONF" || return 1
  for _ in $(seq 1 150); do
    [ "$(sinfo -h -N -o %t 2>/dev/null)" = idle ] && return 0
    sleep 0.2
  done
  echo "slurm_up: the node did not become idle: $(sinfo -N 2>&1)"; tail -5 "$dir"/log/*.log
  return 1
}

slurm_down() {  # slurm_down DIR: stops the daemons (bounded) and removes DIR
  local dir=$1 pids=() p
  for f in "$dir/slurmctld.pid" "$dir/slurmd.pid"; do [ -f "$f" ] && pids+=("$(cat "$f")"); done
  scontrol shutdown >/dev/null 2>&1
  for _ in $(seq 1 50); do
    local alive=0
    for p in "${pids[@]}"; do kill -0 "$p" 2>/dev/null && alive=1; done
    [ $alive = 0 ] && break
    sleep 0.1
  done
  for p in "${pids[@]}"; do kill -9 "$p" 2>/dev/null; done
  runuser -u munge -- /usr/sbin/munged --stop >/dev/null 2>&1
  rm -rf "$dir"
}
