#!/usr/bin/env bash
# `rlx run` with train.placement = colocated, end to end with real processes: the learner
# process also runs the rollout engine (worker 0 on a thread), taking turns on the device
# with it; the hub stays a process of its own. In synchronous mode the run must end with
# the same final parameters as the split run (a process per role), and so must a run whose
# learner process was SIGINTed and resumed, SIGKILLed, or SIGSTOPped; the trajectory log
# must hold every lease exactly once.
#   colocated_test.sh RLX_BINARY WORK_DIR
set -uo pipefail
rlx=$1 work=$2 here=$(cd "$(dirname "$0")" && pwd)
rm -rf "$work" && mkdir -p "$work" && cd "$work"
failures=0
fail() { failures=$((failures + 1)); echo "FAIL: $*"; }
ok() { echo "ok: $*"; }
cp "$here/grpo.yaml" grpo.yaml
colo="train.placement=colocated rollout.workers=1"

# --- what a colocated run cannot be: refused before any process starts, naming the keys ---
out=$("$rlx" run grpo.yaml train.placement=colocated 2>&1); rc=$?
[ $rc = 2 ] && grep -q "train.placement = colocated with rollout.workers = 2" <<<"$out" && [ ! -d runs ] \
  && ok "colocated with 2 workers refused" || fail "2 workers: rc $rc: $out"
out=$("$rlx" run grpo.yaml $colo train.learner_ranks=2 2>&1); rc=$?
[ $rc = 2 ] && grep -q "train.placement = colocated with train.learner_ranks = 2" <<<"$out" && ok "colocated with 2 ranks refused" \
  || fail "2 ranks: rc $rc: $out"
out=$("$rlx" run grpo.yaml $colo train.weight_sync=shm 2>&1); rc=$?
[ $rc = 2 ] && grep -q "train.weight_sync = shm with train.placement = colocated" <<<"$out" && ok "colocated with a weight_sync refused" \
  || fail "weight_sync: rc $rc: $out"

# --- the split reference and the colocated run ---
"$rlx" run grpo.yaml run.name=split > split.log 2>&1 || { fail "split run: $(tail -5 split.log)"; exit 1; }
# shellcheck disable=SC2086
"$rlx" run grpo.yaml run.name=colo $colo trace.enabled=true > colo.log 2>&1 \
  || { fail "colocated run: $(tail -5 colo.log; tail -20 runs/colo/logs/learner-0/rank-0.err)"; exit 1; }
exactly_once() {
  "$rlx" inspect trajectories "$1/trajectories.h5" | python3 -c '
import json, sys
s = json.load(sys.stdin)
assert s["groups"] == s["distinct_leases"] == s["distinct_prompts"], s'
}
same_as_split() {  # same_as_split NAME [SPLIT_RUN]
  local ref=${2:-split}
  if cmp -s "runs/$ref/final/model.safetensors" "runs/$1/final/model.safetensors"; then ok "$1: final parameters equal the $ref run's"
  else fail "$1: final parameters differ from the $ref run's"; fi
  exactly_once "runs/$1" && ok "$1: each lease once" || fail "$1: a lease twice in trajectories.h5"
}
same_as_split colo
python3 - runs/colo <<'P' && ok "colocated: 20 on-policy steps; phases, device busy and peak memory in metrics; one process for both" \
  || fail "colocated metrics or trace"
import json, sys, collections
run = sys.argv[1]
m = [json.loads(l) for l in open(run + "/metrics.jsonl")]
assert [x["step"] for x in m] == list(range(1, 21)), m
assert all(x["version_lag"] == 0 and x["sample_version_min"] == x["step"] - 1 for x in m), m
for x in m:  # (a step's generation may land in the line before it: each line covers the time since the last)
    assert 0 < x["busy_device"] <= 1 and 0 <= x["busy_rollout"] <= 1, x
    assert x["generate_s"] >= 0 and x["train_s"] > 0 and x["sync_s"] >= 0 and x["wait_s"] >= 0, x
    assert x["step_s"] >= x["train_s"], x
    assert x["peak_mem_mb_learner"] > 0 and x["kv_pool_mb"] > 0 and x["weight_copy_s"] >= 0, x
    assert x["graph_steps"] == x["graph_captures"] == x["graph_capture_s"] == 0, x  # no CUDA graphs on a CPU
t = json.load(open(run + "/trace.json"))
names = {e["args"]["name"] for e in t if e["name"] == "process_name"}
assert sum(x["generate_s"] for x in m) > 0 and sum(x["busy_rollout"] for x in m) > 0, m
assert names == {"hub 0", "learner 0"}, names  # no worker process: its spans are the learner's
n = collections.Counter(e["name"] for e in t if e.get("ph") == "X")
assert n["train"] == 20 and n["publish_weights"] == 20 and n["generate"] >= 20, n
P
[ -z "$(ls runs/colo/logs | grep worker)" ] && grep -q "memory plan on cpu" runs/colo/logs/learner-0/rank-0.err \
  && grep -q "rollout KV pool" runs/colo/logs/learner-0/rank-0.err \
  && ok "colocated: no worker process; the memory plan in the learner's log" || fail "colocated: $(ls runs/colo/logs)"

wait_steps() {
  for _ in $(seq 1 1200); do
    [ "$(cat "runs/$1/metrics.jsonl" 2>/dev/null | wc -l)" -ge "$2" ] && return 0
    sleep 0.1
  done
  return 1
}
# The runs a signal interrupts are 60 steps (about 3 s): 20 (1 s colocated) can end before
# a signal sent at step 3 lands. Their reference is the split run of 60 steps.
"$rlx" run grpo.yaml run.name=split60 train.steps=60 > split60.log 2>&1 || fail "split60: $(tail -3 split60.log)"
colo="$colo train.steps=60"
# --- SIGINT, then --resume ---
# shellcheck disable=SC2086
"$rlx" run grpo.yaml run.name=int $colo > int.log 2>&1 &
pid=$!
wait_steps int 3 || fail "int: no progress"
kill -INT $pid; wait $pid; rc=$?
[ $rc = 130 ] && ls runs/int/checkpoints | grep -q step_ && ok "colocated SIGINT: checkpoint, exit 130" || fail "SIGINT: rc $rc: $(tail -3 int.log)"
# shellcheck disable=SC2086
"$rlx" run grpo.yaml run.name=int $colo --resume > int2.log 2>&1 && grep -q resuming int2.log || fail "resume: $(tail -3 int2.log)"
same_as_split int split60

# --- the colocated process SIGKILLed, or SIGSTOPped (stuck: killed), mid-run: the run restarts and completes ---
kill_learner() {  # kill_learner NAME SIGNAL [OVERRIDES...]
  local name=$1 sig=$2
  shift 2
  # shellcheck disable=SC2086
  "$rlx" run grpo.yaml "run.name=$name" $colo "$@" > "$name.log" 2>&1 &
  local pid=$!
  wait_steps "$name" 3 || fail "$name: no progress"
  local victim
  victim=$(pgrep -f -- "role learner.*$PWD/runs/$name " | head -1)  # this test's run only (others run in parallel)
  [ -n "$victim" ] && kill -"$sig" "$victim" || fail "$name: no learner process"
  wait $pid; local rc=$?
  [ $rc = 0 ] && grep -q restart "$name.log" && ok "$name: $sig, restarted, completed" || fail "$name: rc $rc: $(tail -5 "$name.log")"
  same_as_split "$name" split60
}
kill_learner kill KILL
kill_learner stop STOP train.heartbeat_timeout_s=3
grep -q "learner 0 (pid [0-9]*) is stuck" stop.log && ok "stop: reported as stuck" || fail "stop: not reported: $(tail -3 stop.log)"

# --- asynchronous: generation and training take turns under the staleness bound ---
# shellcheck disable=SC2086
"$rlx" run grpo.yaml run.name=async $colo train.mode=async train.steps=30 > async.log 2>&1 || fail "async: $(tail -3 async.log)"
python3 - runs/async/metrics.jsonl <<'P' && ok "colocated async: 30 steps, lag within max_staleness" || fail "async: lag"
import json, sys
m = [json.loads(l) for l in open(sys.argv[1])]
assert len(m) == 30 and all(0 <= x["version_lag"] <= 1 for x in m), [x["version_lag"] for x in m]
P
exactly_once runs/async && ok "colocated async: each lease once" || fail "async: duplicates"

# --- a KV pool the host cannot hold: the memory plan stops the run within seconds, naming the key ---
start=$(date +%s)
# shellcheck disable=SC2086
"$rlx" run grpo.yaml run.name=toobig $colo rollout.kv_cache_blocks=16000000 > toobig.log 2>&1; rc=$?
took=$(( $(date +%s) - start ))
[ $rc = 1 ] && grep -q "learner 0 cannot run: memory plan: the generation phase needs .* MiB on cpu, which has .* free; largest: rollout KV pool .*(rollout.kv_cache_blocks)" toobig.log \
  && [ "$took" -le 30 ] && ok "memory plan: a 125 GiB KV pool refused in ${took} s, naming rollout.kv_cache_blocks" \
  || fail "toobig: rc $rc in ${took} s: $(tail -5 toobig.log)"

echo "$failures failures"
[ "$failures" = 0 ]
