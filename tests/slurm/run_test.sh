#!/usr/bin/env bash
# `rlx run` under a real single-node Slurm that this test starts itself: `srun -n T rlx run`
# gives each task its role from SLURM_PROCID/SLURM_NTASKS (hub, learner ranks, workers).
# In synchronous mode the run must end with the same final parameters as the same config
# run by the local launcher, with every lease exactly once; a killed worker, or learner rank 1, is
# restarted by its task; a plan that does not fit the tasks fails naming the keys.
#   run_test.sh RLX_BINARY WORK_DIR         (needs root: it starts munged, slurmctld, slurmd)
set -uo pipefail
rlx=$1 work=$2 here=$(cd "$(dirname "$0")" && pwd)
[ "$(id -u)" = 0 ] || { echo "FAIL: the Slurm test starts munged/slurmctld/slurmd and needs root"; exit 1; }
for b in munged slurmctld slurmd srun; do
  command -v $b >/dev/null || [ -x /usr/sbin/$b ] || { echo "FAIL: $b missing (scripts/install-deps.sh installs Slurm)"; exit 1; }
done
rm -rf "$work" && mkdir -p "$work" && cd "$work"
# shellcheck source=slurm_env.sh
source "$here/slurm_env.sh"
trap 'slurm_down "$work/slurm"' EXIT
slurm_up "$work/slurm" || { echo "FAIL: slurm did not start"; exit 1; }
failures=0
fail() { failures=$((failures + 1)); echo "FAIL: $*"; }
ok() { echo "ok: $*"; }
exactly_once() {
  "$rlx" inspect trajectories "$1/trajectories.h5" | python3 -c '
import json, sys
s = json.load(sys.stdin)
assert s["groups"] == s["distinct_leases"] == s["distinct_prompts"] > 0, s'
}

# the e2e suite's config, 4 steps, run name "local"
sed -e 's/steps: 20,/steps: 4,/' -e 's/name: clean,/name: local,/' "$here/../e2e/grpo.yaml" > grpo.yaml
grep -q "steps: 4," grpo.yaml && grep -q "name: local," grpo.yaml || { echo "FAIL: tests/e2e/grpo.yaml changed shape"; exit 1; }
"$rlx" run grpo.yaml > local.log 2>&1 || fail "local run: $(tail -3 local.log)"
"$rlx" run grpo.yaml run.name=local2 train.learner_ranks=2 > local2.log 2>&1 || fail "local 2-rank run: $(tail -3 local2.log)"

# shellcheck source=../e2e/checks.sh
source "$here/../e2e/checks.sh"
workers_ended() {  # workers_ended RUN
  local bad
  bad=$(workers_stopped_first "runs/$1")
  [ -z "$bad" ] && ok "$1: the workers stopped before the hub, none waiting on it" || fail "$1: a worker waited on a stopped hub: $bad"
}
same_as() {  # same_as RUN REF
  cmp -s "runs/$2/final/model.safetensors" "runs/$1/final/model.safetensors" \
    && ok "$1: final parameters equal the local launcher's ($2)" || fail "$1: final parameters differ from $2's"
  exactly_once "runs/$1" && ok "$1: each lease once" || fail "$1: a lease missing or twice"
}

# 1 hub + 1 learner + 2 workers = 4 tasks
timeout 300 srun -n4 --kill-on-bad-exit=1 "$rlx" run grpo.yaml run.name=slurm > slurm.log 2>&1; rc=$?
[ $rc = 0 ] && grep -q "task 0/4: hub 0.*done" slurm.log && ls runs/slurm/logs | grep -q "^worker-1$" \
  && ok "srun -n4: hub, learner, 2 workers as tasks; done" || fail "srun -n4: rc $rc: $(tail -5 slurm.log)"
same_as slurm local
workers_ended slurm

# 1 hub + 2 learner ranks (store hosted by task 0) + 2 workers = 5 tasks
timeout 300 srun -n5 --kill-on-bad-exit=1 "$rlx" run grpo.yaml run.name=slurm2 train.learner_ranks=2 > slurm2.log 2>&1; rc=$?
[ $rc = 0 ] && ls runs/slurm2/logs | grep -q "^learner-1$" && ok "srun -n5: 2 learner ranks as tasks" \
  || fail "srun -n5: rc $rc: $(tail -5 slurm2.log)"
same_as slurm2 local2
workers_ended slurm2

# the transport of tasks on many nodes (train.transport=tcp): the hub, the learner group's
# store and Gloo, and the weights over tcp by this host's name; the same parameters
timeout 300 srun -n5 --kill-on-bad-exit=1 "$rlx" run grpo.yaml run.name=slurmtcp train.learner_ranks=2 train.transport=tcp \
  > slurmtcp.log 2>&1; rc=$?
[ $rc = 0 ] && grep -q "^tcp://$(hostname):[0-9]*$" runs/slurmtcp/hub.endpoint \
  && grep -q "^tcp://$(hostname):[0-9]*$" runs/slurmtcp/weights.endpoint \
  && ok "srun -n5, train.transport=tcp: hub and weights served over tcp by host name" \
  || fail "slurmtcp: rc $rc: $(tail -5 slurmtcp.log)"
same_as slurmtcp local2
workers_ended slurmtcp
out=$(SLURM_PROCID=1 SLURM_NTASKS=4 SLURM_NNODES=2 "$rlx" run grpo.yaml run.name=twonodes train.transport=local 2>&1); rc=$?
[ $rc = 2 ] && grep -q "2 nodes (SLURM_NNODES) with train.transport = local" <<<"$out" \
  && ok "tasks on 2 nodes with train.transport=local are refused" || fail "2 nodes, local: rc $rc: $out"

kill_mid_run() {  # kill_mid_run NAME STEPS ROLE TASKS [OVERRIDES...]: SIGKILL ROLE 1 after STEPS steps; rc in $rc
  local name=$1 steps=$2 role=$3 tasks=$4
  shift 4
  timeout 300 srun -n"$tasks" --kill-on-bad-exit=1 "$rlx" run grpo.yaml run.name="$name" "$@" > "$name.log" 2>&1 &
  local pid=$!
  for _ in $(seq 1 600); do [ "$(cat "runs/$name/metrics.jsonl" 2>/dev/null | wc -l)" -ge "$steps" ] && break; sleep 0.1; done
  local victim
  victim=$(pgrep -f -- "role $role.*runs/$name.*--index 1" | head -1)
  [ -n "$victim" ] && kill -9 "$victim" || fail "$name: no $role 1 to kill"
  wait $pid; rc=$?
}
# a worker SIGKILLed mid-run (30 steps of about 0.05 s: still running at step 2): its task restarts it
kill_mid_run slurmkill 2 worker 4 train.steps=30
"$rlx" run grpo.yaml run.name=local30 train.steps=30 > local30.log 2>&1 || fail "local30: $(tail -3 local30.log)"
[ $rc = 0 ] && grep -q "worker 1 ended: killed by signal 9.*restarting it" slurmkill.log \
  && ok "slurmkill: worker 1 killed, restarted by its task, run completed" || fail "slurmkill: rc $rc: $(tail -5 slurmkill.log)"
same_as slurmkill local30

# learner rank 1 SIGKILLed mid-run (12 steps; after the checkpoint of step 2): its task restarts it
# alone and the group re-forms around it; the hub and the workers go on; the local run's parameters
kill_mid_run slurmrank1 3 learner 5 train.learner_ranks=2 train.steps=12
"$rlx" run grpo.yaml run.name=local2x12 train.learner_ranks=2 train.steps=12 > local2x12.log 2>&1 \
  || fail "local2x12: $(tail -3 local2x12.log)"
[ $rc = 0 ] && grep -q "learner 1 ended: killed by signal 9.*restarting it alone" slurmrank1.log \
  && grep -q "the group re-formed (generation 1)" runs/slurmrank1/logs/learner-0/rank-0.err \
  && grep -q "rank 1 ended (killed by signal 9" runs/slurmrank1/logs/learner-0/rank-0.err \
  && ok "slurmrank1: learner rank 1 killed, named at once (its task recorded how it ended), restarted by its task, the group re-formed, run completed" \
  || fail "slurmrank1: rc $rc: $(tail -5 slurmrank1.log)"
same_as slurmrank1 local2x12

# a plan that does not fit the tasks: every task fails before starting a role, naming the keys
out=$(timeout 120 srun -n3 "$rlx" run grpo.yaml run.name=misfit 2>&1); rc=$?
[ $rc != 0 ] && grep -q "3 tasks (SLURM_NTASKS).*train.learner_ranks.*rollout.workers" <<<"$out" && [ ! -d runs/misfit ] \
  && ok "srun -n3: the misfit plan is refused, naming the keys" || fail "misfit: rc $rc: $out"

echo "$failures failures"
[ "$failures" = 0 ]
