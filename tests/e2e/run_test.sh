#!/usr/bin/env bash
# `rlx run` end to end with real processes: a synchronous GRPO run with the hub, the
# learner and 2 rollout workers; SIGINT + --resume; SIGKILL of a worker, the hub and the
# learner. In synchronous mode each of these must end with the same final parameters as
# the fault-free run, and the trajectory log must hold every lease exactly once.
#   run_test.sh RLX_BINARY WORK_DIR [TRAINER_EXAMPLE]
set -uo pipefail
rlx=$1 work=$2 trainer=${3:-} here=$(cd "$(dirname "$0")" && pwd)
rm -rf "$work" && mkdir -p "$work" && cd "$work"
failures=0
fail() { failures=$((failures + 1)); echo "FAIL: $*"; }
ok() { echo "ok: $*"; }

cp "$here/grpo.yaml" grpo.yaml

# --- bad configs fail before any process starts, naming the key ---
out=$("$rlx" run grpo.yaml train.stepz=3 2>&1); rc=$?
[ $rc = 2 ] && grep -q "train.stepz" <<<"$out" && grep -q "did you mean 'train.steps'" <<<"$out" && [ ! -d runs ] \
  && ok "unknown key" || fail "unknown key: rc $rc: $out"
out=$("$rlx" run grpo.yaml train.steps=many 2>&1); rc=$?
[ $rc = 2 ] && grep -q "train.steps" <<<"$out" && [ ! -d runs ] && ok "wrong type" || fail "wrong type: rc $rc: $out"
out=$("$rlx" run grpo.yaml train.learner_ranks=5 2>&1); rc=$?
[ $rc = 2 ] && grep -q "train.learner_ranks = 5: more learner ranks than train.groups_per_step = 4" <<<"$out" && [ ! -d runs ] \
  && ok "impossible placement" || fail "placement: rc $rc: $out"

# --- the fault-free run ---
"$rlx" run grpo.yaml learner.checkpoint_keep_last=2 trace.enabled=true run.plots=true > clean.log 2>&1; rc=$?
[ $rc = 0 ] || { fail "clean run: rc $rc"; cat clean.log runs/clean/logs/*/rank-0.err | tail -40; exit 1; }
python3 - runs/clean/metrics.jsonl <<'P' && ok "clean run: 20 steps, on-policy (lag 0), versions advance" || fail "clean run metrics"
import json, sys
m = [json.loads(l) for l in open(sys.argv[1])]
assert [x["step"] for x in m] == list(range(1, 21)), m
assert all(x["version_lag"] == 0 and x["sample_version_min"] == x["step"] - 1 for x in m), m
assert all(x["samples"] == 16 for x in m)
assert all(x["entropy"] > 0 for x in m), [x["entropy"] for x in m]  # measured with entropy_coef 0 too
P
exactly_once() {  # every lease and prompt once in the trajectory log
  "$rlx" inspect trajectories "$1/trajectories.h5" | python3 -c '
import json, sys
s = json.load(sys.stdin)
assert s["groups"] == s["distinct_leases"] == s["distinct_prompts"], s
print(s["groups"], "groups")'
}
exactly_once runs/clean >/dev/null && ok "clean run: each lease once in trajectories.h5" || fail "clean run: duplicates"
python3 - runs/clean <<'P' && ok "trace.json: every process's spans; busy fractions in metrics" || fail "trace/busy: see above"
import json, sys, collections
t = json.load(open(sys.argv[1] + "/trace.json"))
names = {e["args"]["name"] for e in t if e["name"] == "process_name"}
assert names == {"hub 0", "learner 0", "worker 0", "worker 1"}, names
n = collections.Counter(e["name"] for e in t if e.get("ph") == "X")
assert n["train"] == 20 and n["publish_weights"] == 20 and n["generate"] >= 20 and n["rollout"] >= 20, n
assert all(e["dur"] >= 0 for e in t if e.get("ph") == "X")
m = [json.loads(l) for l in open(sys.argv[1] + "/metrics.jsonl")]
assert all(0 <= x["busy_learner"] <= 1 for x in m), [x["busy_learner"] for x in m]
assert any("busy_rollout" in x and 0 <= x["busy_rollout"] <= 1 for x in m), m[-1]
P
[ -f runs/clean/final/model.safetensors ] && [ -f runs/clean/final/config.json ] && ok "final HF export" || fail "no final export"
"$rlx" inspect tensorboard runs/clean/tensorboard | python3 -c '
import json, sys
e = [json.loads(l) for l in sys.stdin]
assert e[0]["file_version"] == "brain.Event:2", e[0]
steps = [x for x in e if "scalars" in x]
assert [x["step"] for x in steps] == list(range(1, 21)), [x["step"] for x in steps]
assert all("reward_mean" in x["scalars"] and "tokens_per_s" in x["scalars"] for x in steps)
' && ok "TensorBoard events: a scalar event per step, every CRC valid" || fail "tensorboard events"
[ "$(ls runs/clean/plots/*.png 2>/dev/null | wc -l)" -ge 5 ] && grep -q "rlx run: plots $PWD/runs/clean/plots" clean.log \
  && ok "PNG plots of the curves at the end" || fail "plots: $(ls runs/clean/plots; cat runs/clean/logs/plots/rank-0.err)"
[ "$(ls runs/clean/checkpoints | grep -c step_)" = 2 ] && [ "$(ls runs/clean | grep -c '^hub-step_')" = 2 ] \
  && ok "hub states pruned with their checkpoints" || fail "hub states: $(ls runs/clean runs/clean/checkpoints)"
out=$("$rlx" run grpo.yaml 2>&1); rc=$?
[ $rc = 2 ] || [ $rc = 1 ] && grep -q -- "--resume continues it, --force" <<<"$out" && ok "refuses a used run directory" \
  || fail "used run directory: rc $rc: $out"

same_as_clean() {  # same_as_clean NAME [REFERENCE_RUN]
  local ref=${2:-clean}
  if cmp -s "runs/$ref/final/model.safetensors" "runs/$1/final/model.safetensors"; then ok "$1: final parameters equal the $ref run's"
  else fail "$1: final parameters differ from the $ref run's"; fi
  exactly_once "runs/$1" >/dev/null && ok "$1: each lease once" || fail "$1: a lease twice in trajectories.h5"
}
wait_steps() {  # wait_steps NAME N: until the run has N metrics lines (bounded)
  for _ in $(seq 1 1200); do
    [ "$(cat "runs/$1/metrics.jsonl" 2>/dev/null | wc -l)" -ge "$2" ] && return 0
    sleep 0.1
  done
  return 1
}

# --- the live metrics endpoint while a run goes (a long run, stopped once read) ---
mport=$(python3 -c 'import socket; s = socket.socket(); s.bind(("127.0.0.1", 0)); print(s.getsockname()[1])')
"$rlx" run grpo.yaml run.name=live train.steps=2000 learner.checkpoint_every=0 log.metrics_port=$mport > live.log 2>&1 &
pid=$!
wait_steps live 3 || fail "live: no progress"
python3 - "$mport" <<'P' && ok "live metrics: Prometheus text of the latest step while the run goes" || fail "live metrics: $(grep metrics live.log)"
import sys, urllib.request
text = urllib.request.urlopen(f"http://127.0.0.1:{sys.argv[1]}/metrics", timeout=10).read().decode()
g = {l.split()[0]: float(l.split()[1]) for l in text.splitlines() if l and not l.startswith("#")}
assert g["rlx_up"] == 1 and g["rlx_train_steps"] == 2000 and g["rlx_step"] >= 3, g
assert "rlx_reward_mean" in g and "rlx_tokens_per_s" in g and "rlx_busy_learner" in g and "rlx_version_lag" in g, sorted(g)
kinds = ("infra", "data", "filtered", "worker_reported", "rejected", "worker_restarts", "killed_stuck", "run_restarts",
         "learner_rank_restarts")
assert all(g[f"rlx_errors_{k}"] == 0 for k in kinds), {k: g.get(f"rlx_errors_{k}") for k in kinds}
P
# Errors by kind move: a worker killed is restarted (rlx_errors_worker_restarts), its leases
# re-issued; the run goes on.
victim=$(pgrep -f -- "role worker.*$PWD/runs/live" | head -1)
[ -n "$victim" ] && kill -KILL "$victim"
python3 - "$mport" <<'P' && ok "live metrics: a killed worker counts in rlx_errors_worker_restarts" || fail "live metrics: errors by kind"
import sys, time, urllib.request
for _ in range(150):
    text = urllib.request.urlopen(f"http://127.0.0.1:{sys.argv[1]}/metrics", timeout=10).read().decode()
    g = {l.split()[0]: float(l.split()[1]) for l in text.splitlines() if l and not l.startswith("#")}
    if g.get("rlx_errors_worker_restarts", 0) >= 1:
        break
    time.sleep(0.2)
assert g["rlx_errors_worker_restarts"] == 1 and g["rlx_errors_run_restarts"] == 0, g
P
kill -INT $pid; wait $pid

# --- SIGINT, then --resume ---
"$rlx" run grpo.yaml run.name=int > int.log 2>&1 &
pid=$!
wait_steps int 3 || fail "int: no progress"
kill -INT $pid; wait $pid; rc=$?
[ $rc = 130 ] && grep -q -- "--resume" int.log && ls runs/int/checkpoints | grep -q step_ && ok "SIGINT: checkpoint, exit 130" \
  || fail "SIGINT: rc $rc: $(tail -3 int.log)"
[ ! -d runs/int/final ] || fail "SIGINT: stopped early but wrote final"
"$rlx" run grpo.yaml run.name=int --resume > int2.log 2>&1 || fail "resume: $(tail -3 int2.log)"
grep -q "resuming" int2.log || fail "resume: did not resume"
same_as_clean int
[ "$(wc -l < runs/int/metrics.jsonl)" = 20 ] && ok "resume: 20 metrics lines" || fail "resume: metrics lines"

# --- SIGKILL of one role mid-run: the run completes ---
kill_role() {  # kill_role NAME ROLE_PATTERN [SIGNAL [OVERRIDES...]]
  local name=$1 pattern=$2 sig=${3:-KILL}
  shift 3 2>/dev/null || shift $#
  "$rlx" run grpo.yaml "run.name=$name" "$@" > "$name.log" 2>&1 &
  local pid=$!
  set -- "$name" "$pattern"
  wait_steps "$1" 3 || fail "$1: no progress"
  local victim
  victim=$(pgrep -f -- "$2.*$PWD/runs/$1" | ${PICK:-head} -1)  # PICK=tail: the newest (learner rank 1)
  [ -n "$victim" ] && kill -"$sig" "$victim" || fail "$1: no process matching $2"
  wait $pid; local rc=$?
  [ $rc = 0 ] && grep -q restart "$1.log" && ok "$1: killed, restarted, completed" || fail "$1: rc $rc: $(tail -5 "$1.log")"
  same_as_clean "$1" "${REF:-clean}"
}
kill_role killworker "role worker"
kill_role killhub "role hub"
kill_role killlearner "role learner"
# An env server SIGKILLed mid-run: its worker restarts it; the episodes it held are retried.
"$rlx" run grpo.yaml run.name=killenv env.servers=1 > killenv.log 2>&1 &
pid=$!
wait_steps killenv 3 || fail "killenv: no progress"
# The server's own output reaches its worker's log while it runs (streamed through the sandbox).
grep -q "env server: serving" runs/killenv/logs/worker-*/rank-0.err && ok "killenv: the env server's log is live in its worker's" \
  || fail "killenv: no env server output in the worker's log while it runs"
# Its sandbox's address-space limit: env.sandbox.memory_mb (1024) plus what its libraries map.
mb=$(pgrep -af -- "sandbox run.*killenv" | grep -o -- "--memory-mb [0-9]*" | head -1 | cut -d' ' -f2)
[ "${mb:-0}" -gt 1024 ] && ok "killenv: the server's memory limit leaves room for its libraries ($mb MiB)" \
  || fail "killenv: the server's --memory-mb is ${mb:-not found}"
victim=$(pgrep -f -- "env serve --address ipc://[^ ]*killenv" | tail -1)  # run_dir/env-sockets, or /tmp/rlx-killenv-HASH
[ -n "$victim" ] && kill -KILL "$victim" || fail "killenv: no env server to kill"
wait $pid; rc=$?
[ $rc = 0 ] && grep -q "env server .* ended (exit 137)" runs/killenv/logs/worker-*/rank-0.err \
  && ok "killenv: env server killed, restarted by its worker, run completed" \
  || fail "killenv: rc $rc: $(tail -3 killenv.log; grep -h "env server" runs/killenv/logs/worker-*/rank-0.err | tail -2)"
same_as_clean killenv
# Restarts are bounded: past rollout.max_restarts and train.max_restarts the run fails cleanly,
# naming the role, its index and the cause.
"$rlx" run grpo.yaml run.name=giveup rollout.max_restarts=0 train.max_restarts=0 > giveup.log 2>&1 &
pid=$!
wait_steps giveup 2 || fail "giveup: no progress"
victim=$(pgrep -f -- "role worker.*$PWD/runs/giveup" | head -1)
[ -n "$victim" ] && kill -KILL "$victim" || fail "giveup: no worker to kill"
wait $pid; rc=$?
[ $rc = 1 ] && grep -q "worker [01] ended: killed by signal 9" giveup.log && grep -q "train.max_restarts); stopping" giveup.log \
  && [ -z "$(pgrep -f -- "$PWD/runs/giveup")" ] && ok "giveup: past its restarts the run fails, naming worker, index and signal" \
  || fail "giveup: rc $rc: $(tail -3 giveup.log)"
# The launcher killed with SIGKILL: every role and env server goes with it (PDEATHSIG).
"$rlx" run grpo.yaml run.name=orphans env.servers=1 train.steps=200 > orphans.log 2>&1 &
pid=$!
wait_steps orphans 2 || fail "orphans: no progress"
[ "$(pgrep -f -- "$PWD/runs/orphans" | wc -l)" -ge 6 ] || fail "orphans: not every role found: $(pgrep -af -- runs/orphans)"
# Every role ignores SIGPIPE (bit 13 of SigIgn): a peer killed mid-write is an error to recover from.
ignoring=0 roles=0
for p in $(pgrep -f -- "role .*$PWD/runs/orphans"); do
  mask=$(awk '/^SigIgn:/ {print $2}' /proc/$p/status 2>/dev/null)
  [ -n "$mask" ] || continue
  roles=$((roles + 1)); (( 0x$mask & 0x1000 )) && ignoring=$((ignoring + 1))
done
[ $roles -ge 3 ] && [ $ignoring = $roles ] && ok "orphans: every role ignores SIGPIPE" \
  || fail "orphans: $ignoring of $roles roles ignore SIGPIPE"
kill -KILL $pid; wait $pid 2>/dev/null
for _ in $(seq 1 300); do [ -z "$(pgrep -f -- "$PWD/runs/orphans")" ] && break; sleep 0.1; done
left=$(pgrep -af -- "$PWD/runs/orphans")
[ -z "$left" ] && ok "orphans: the launcher SIGKILLed, every child ended within 30 s" || fail "orphans: left running: $left"
pkill -KILL -f -- "runs/orphans" 2>/dev/null
# A stopped (SIGSTOP) role beats no more: the launcher reports it, kills it, and restarts.
kill_role stopworker "role worker" STOP train.heartbeat_timeout_s=3 rollout.workers=1
grep -q "worker 0 (pid [0-9]*) is stuck: no heartbeat" stopworker.log && ok "stopworker: reported as stuck" \
  || fail "stopworker: not reported: $(tail -3 stopworker.log)"
kill_role stoplearner "role learner" STOP train.heartbeat_timeout_s=3
grep -q "learner 0 (pid [0-9]*) is stuck" stoplearner.log && ok "stoplearner: reported as stuck" || fail "stoplearner: not reported"
# A role slow to start (loading, a busy host) is not taken for stuck: before its first heartbeat
# it has train.start_timeout_s, not the (here 2 s) heartbeat timeout. One that overruns that is,
# once per process. The start timeout there is 10 s and the learner 20 s late: every role of
# a loaded CI host, loading LibTorch beside other tests, has overrun 2 s.
RLX_FAULT=slow-start:learner:4 "$rlx" run grpo.yaml run.name=slowstart train.heartbeat_timeout_s=2 > slowstart.log 2>&1 \
  && [ -f runs/slowstart/fault-injected ] && ! grep -q stuck slowstart.log \
  && ok "slowstart: a learner 4 s late to its first heartbeat is waited for" || fail "slowstart: $(tail -3 slowstart.log)"
same_as_clean slowstart
RLX_FAULT=slow-start:learner:20 "$rlx" run grpo.yaml run.name=startout train.heartbeat_timeout_s=2 train.start_timeout_s=10 \
  > startout.log 2>&1 && grep -q "learner 0 (pid [0-9]*) is stuck: no first heartbeat .*(train.start_timeout_s)" startout.log \
  && [ -z "$(grep -o "(pid [0-9]*) is stuck" startout.log | sort | uniq -d)" ] \
  && ok "startout: a learner past train.start_timeout_s is reported (once), killed, restarted" || fail "startout: $(tail -3 startout.log)"
same_as_clean startout

# --- a learner group of 2 ranks (FSDP-style sharded), and the death of its rank 1 ---
"$rlx" run grpo.yaml run.name=clean2 train.learner_ranks=2 > clean2.log 2>&1 || fail "2 ranks: $(tail -3 clean2.log)"
python3 - runs/clean2/metrics.jsonl <<'P' && ok "2 ranks: 20 steps, batch-wide metrics" || fail "2 ranks: metrics"
import json, sys
m = [json.loads(l) for l in open(sys.argv[1])]
assert len(m) == 20 and all(x["learner_ranks"] == 2 and x["samples"] == 16 and x["version_lag"] == 0 for x in m), m
P
exactly_once runs/clean2 >/dev/null && ok "2 ranks: each lease once" || fail "2 ranks: duplicates"
# Rank 1 alone is restarted; with it, rank 0 re-forms the group under generation 1, both resume
# from the newest checkpoint and rank 0 trains the steps since from the batches it kept: the hub
# and the workers go on (no restart of the run), and the parameters are the clean run's.
REF=clean2 PICK=tail kill_role killrank1 "role learner" KILL train.learner_ranks=2
grep -q "learner 1 ended: killed by signal 9.*restarting it alone: the learner group re-forms around it" killrank1.log \
  && ! grep -q "restarting the run" killrank1.log && [ ! -d runs/killrank1/logs/hub-0.1000 ] \
  && grep -q "the group re-formed (generation 1); restored step" runs/killrank1/logs/learner-0/rank-0.err \
  && grep -q "joined the learner group's generation 1" runs/killrank1/logs/learner-0/rank-1.1.err \
  && python3 -c 'import json, sys; m = [json.loads(l)["step"] for l in open(sys.argv[1])]; assert m == list(range(1, 21)), m' \
       runs/killrank1/metrics.jsonl \
  && ok "killrank1: rank 1 restarted alone, the group re-formed, every step reported once" \
  || fail "killrank1: $(grep -h "rlx run:\|re-form" killrank1.log runs/killrank1/logs/learner-0/*.err | tail -6)"
# Rank 1 killed inside the checkpoint of step 4, once the shards are written: rank 0 commits
# it alone and fails the last barrier (or, the kill seen sooner, an earlier one). Each step is
# still reported once, and the parameters are the clean run's.
RLX_CHECKPOINT_CRASH_AT=shards-agreed RLX_CHECKPOINT_CRASH_RANK=1 RLX_CHECKPOINT_CRASH_STEP=4 \
  RLX_CHECKPOINT_CRASH_ONCE="$PWD/ckptrank1.crashed" \
  "$rlx" run grpo.yaml run.name=ckptrank1 train.learner_ranks=2 > ckptrank1.log 2>&1 \
  && [ -f ckptrank1.crashed ] && grep -q "the group re-formed (generation 1); restored step" runs/ckptrank1/logs/learner-0/rank-0.err \
  && python3 -c 'import json, sys; m = [json.loads(l)["step"] for l in open(sys.argv[1])]; assert m == list(range(1, 21)), m' \
       runs/ckptrank1/metrics.jsonl \
  && ok "ckptrank1: rank 1 killed in a checkpoint; the group re-formed, every step reported once" \
  || fail "ckptrank1: $(grep -h "rlx run:\|re-form\|Error" ckptrank1.log runs/ckptrank1/logs/learner-0/*.err | tail -6)"
same_as_clean ckptrank1 clean2
# PPO with 2 epochs x 2 mini-batches (4 optimizer steps a run step; the checkpoints count
# optimizer steps), a rank killed inside a backward (RLX_COMM_CRASH=RANK:N:WHAT, once): rank 1
# (the group re-forms; the gradients the cut-short backward left are dropped), then rank 0 (the
# run restarts and resumes at the run step it saved, not the optimizer step). Both end with the
# clean run's parameters and every step reported once.
ppo2="algorithm.name=ppo algorithm.epochs=2 algorithm.mini_batches=2 train.learner_ranks=2"
"$rlx" run grpo.yaml run.name=ppo2 $ppo2 > ppo2.log 2>&1 || fail "ppo2: $(tail -3 ppo2.log)"
for r in 1 0; do
  RLX_COMM_CRASH="$r:23:layers.1 gradients" RLX_COMM_CRASH_ONCE="$PWD/ppo2kill$r.crashed" \
    "$rlx" run grpo.yaml run.name=ppo2kill$r $ppo2 > ppo2kill$r.log 2>&1 \
    && [ -f ppo2kill$r.crashed ] && grep -q "learner $r ended: killed by signal 9" ppo2kill$r.log \
    && python3 -c 'import json, sys; m = [json.loads(l)["step"] for l in open(sys.argv[1])]; assert m == list(range(1, 21)), m' \
         runs/ppo2kill$r/metrics.jsonl \
    && ok "ppo2kill$r: rank $r killed in a backward; every step reported once" \
    || fail "ppo2kill$r: $(grep -h "rlx run:\|re-form\|Error" ppo2kill$r.log runs/ppo2kill$r/logs/learner-0*/*.err | tail -6)"
  same_as_clean ppo2kill$r ppo2
done
grep -q "the group re-formed (generation 1)" runs/ppo2kill1/logs/learner-0/rank-0.err && grep -q "resuming .* at step [1-9]" ppo2kill0.log \
  && ok "ppo2kill: rank 1 re-formed the group; rank 0 restarted the run" || fail "ppo2kill: not re-formed / restarted"
# The tcp transport (for tasks on many hosts), here on one: the same run, the same parameters.
"$rlx" run grpo.yaml run.name=tcp train.learner_ranks=2 train.transport=tcp > tcp.log 2>&1 \
  && grep -q "serving tcp://" runs/tcp/logs/hub-0/rank-0.err && grep -q "^tcp://" runs/tcp/weights.endpoint \
  && ok "tcp transport: hub and weights over tcp" || fail "tcp transport: $(tail -3 tcp.log)"
same_as_clean tcp clean2
# Weights by collective broadcast from learner rank 0 (Gloo here): the same parameters; a
# worker killed is sent the last version as it rejoins, a learner killed is followed to its
# new endpoint and its older (checkpointed) version taken.
"$rlx" run grpo.yaml run.name=bcast train.weight_sync=broadcast > bcast.log 2>&1 && grep -q "^tcp://" runs/bcast/weights.bcast \
  && ok "broadcast weight sync" || fail "broadcast weight sync: $(tail -3 bcast.log)"
same_as_clean bcast
kill_role bcastworker "role worker" KILL train.weight_sync=broadcast
kill_role bcastlearner "role learner" KILL train.weight_sync=broadcast
out=$("$rlx" run grpo.yaml train.weight_sync=shm train.transport=tcp 2>&1); rc=$?
[ $rc = 2 ] && grep -q "train.weight_sync = shm with train.transport = tcp" <<<"$out" && ok "shm weights over tcp refused" \
  || fail "shm weights over tcp: rc $rc: $out"
# The learner asking for its next batch while it trains (learner.prefetch_batch): in this
# synchronous run the batch asked ahead waits for the new weights' groups, so nothing changes.
"$rlx" run grpo.yaml run.name=prefetch learner.prefetch_batch=true > prefetch.log 2>&1 \
  || fail "prefetch: $(tail -3 prefetch.log)"
same_as_clean prefetch
# Asynchronous, it still trains no group staler than hub.replay.max_staleness (1 here): the
# batch asked ahead holds only groups fresh at the version it will be trained with.
"$rlx" run grpo.yaml run.name=asyncprefetch train.mode=async train.steps=30 learner.prefetch_batch=true \
  > asyncprefetch.log 2>&1 || fail "async prefetch: $(tail -3 asyncprefetch.log)"
python3 - runs/asyncprefetch/metrics.jsonl <<'P' && ok "async prefetch: 30 steps, lag within max_staleness" || fail "async prefetch: lag"
import json, sys
m = [json.loads(l) for l in open(sys.argv[1])]
assert len(m) == 30 and all(0 <= x["version_lag"] <= 1 for x in m), [x["version_lag"] for x in m]
P
exactly_once runs/asyncprefetch >/dev/null && ok "async prefetch: each lease once" || fail "async prefetch: duplicates"

# --- multi-turn episodes through a sandboxed env server, async mode ---
"$rlx" run grpo.yaml run.name=turns env.name=guess_number env.max_turns=3 env.servers=1 rollout.max_new_tokens=6 \
  rollout.workers=1 train.mode=async train.steps=2 learner.checkpoint_every=0 > turns.log 2>&1 \
  || fail "multi-turn run: $(tail -3 turns.log)"
"$rlx" inspect trajectories runs/turns/trajectories.h5 --dump 100 | grep '^{"' | python3 -c '
import json, sys
turns = []
for line in sys.stdin:
    for t in json.loads(line)["samples"]:
        m, v = t["loss_mask"], t["versions"]
        assert len(m) == len(v) == len(t["tokens"]) == len(t["logprobs"])
        assert all((x >= 0) == (k == 1) for x, k in zip(v, m)), "a version outside an action, or none inside one"
        turns.append(sum(1 for i in range(1, len(m)) if m[i] == 1 and m[i - 1] == 0))
assert turns and max(turns) >= 2 and all(1 <= n <= 3 for n in turns), turns
' && ok "multi-turn: actions and observations interleave, versions on actions only" || fail "multi-turn trajectories"

# --- a worker killed mid-episode: its episodes continue from their checkpoint, not from turn 0 ---
long="env.name=guess_number env.max_turns=4 env.servers=1 rollout.max_new_tokens=6 rollout.workers=1 train.steps=2
  learner.checkpoint_every=0 rollout.episode_checkpoint_turns=1"
# shellcheck disable=SC2086
"$rlx" run grpo.yaml run.name=long $long > long.log 2>&1 || fail "long: $(tail -3 long.log)"
# shellcheck disable=SC2086
RLX_FAULT=kill-after-episode-checkpoint:0:3 "$rlx" run grpo.yaml run.name=longkill $long > longkill.log 2>&1 \
  && grep -q "worker 0 ended: killed by signal 9" longkill.log && [ -f runs/longkill/fault-injected ] \
  && grep -q "continues its episodes at turn [1-3]" runs/longkill/logs/worker-0.*/rank-0.err \
  && ok "longkill: a worker killed after an episode checkpoint; its successor continued the episodes mid-way" \
  || fail "longkill: $(tail -3 longkill.log; tail -3 runs/longkill/logs/worker-0*/rank-0.err)"
same_as_clean longkill long
[ -z "$(ls runs/longkill/episodes 2>/dev/null)" ] && ok "longkill: no episode checkpoint left" || fail "longkill: stale episode checkpoints"

# --- rollout workers join and leave a running job (rlx scale) without loss ---
# 200 steps (about 10 s here): each scale command is a process start of its own, slowed by
# the workers starting beside it; the next is sent once the launcher answered the last.
"$rlx" run grpo.yaml run.name=scaleref train.steps=200 > scaleref.log 2>&1 || fail "scaleref: $(tail -3 scaleref.log)"
"$rlx" run grpo.yaml run.name=scale train.steps=200 rollout.workers=1 > scale.log 2>&1 &
pid=$!
answered() {  # answered LOG PATTERN: wait (bounded) until the launcher logged it
  for _ in $(seq 1 300); do grep -q "$2" "$1" && return 0; sleep 0.1; done
  return 1
}
wait_steps scale 2 && "$rlx" scale runs/scale --workers 3 2>>scale.err && answered scale.log "rollout workers 1 -> 3" \
  || fail "scale up: $(cat scale.err)"
"$rlx" scale runs/scale --workers 1 2>>scale.err && answered scale.log "rollout workers 3 -> 1" || fail "scale down: $(cat scale.err)"
wait $pid; rc=$?
[ $rc = 0 ] && grep -q "rollout workers 1 -> 3" scale.log && grep -q "rollout workers 3 -> 1" scale.log \
  && [ "$(grep -c "worker [12] left (clean)" scale.log)" = 2 ] && grep -q "leaving (rlx scale)" runs/scale/logs/worker-2/rank-0.err \
  && ok "scale: 1 -> 3 -> 1 rollout workers; the two that left sent what they held" || fail "scale: rc $rc: $(tail -5 scale.log)"
# They said goodbye: the hub counted them gone at once, not lost after its peer timeout.
[ "$(grep -c "hub: worker worker-[12] left" runs/scale/logs/hub-0/rank-0.err)" = 2 ] && ! grep -q " lost: " runs/scale/logs/hub-0/rank-0.err \
  && ok "scale: the hub heard both leave (Bye)" || fail "scale: the hub did not hear the workers leave: $(grep -h "left\| lost" runs/scale/logs/hub-0/rank-0.err)"
same_as_clean scale scaleref
out=$("$rlx" scale runs/scale --workers 2 2>&1); rc=$?
[ $rc != 0 ] && grep -q "is not running" <<<"$out" && ok "scale: a finished run is refused" || fail "scale after the end: rc $rc: $out"

# --- the same through the config file reloaded (SIGHUP to the launcher) ---
sed 's/workers: 2/workers: 1/' grpo.yaml > reload.yaml
"$rlx" run reload.yaml run.name=reload train.steps=200 > reload.log 2>&1 &
pid=$!
hup_until() {  # hup_until PATTERN: SIGHUP, then wait (bounded) for the launcher to answer
  kill -HUP $pid
  answered reload.log "$1"
}
wait_steps reload 2 && sed -i 's/workers: 1/workers: 3/; s/lr: 1e-3/lr: 2e-3/' reload.yaml && hup_until "rollout.workers 1 -> 3" \
  || fail "reload up: $(tail -3 reload.log)"
sed 's/groups_per_step: 4/groups_per_step: four/' reload.yaml > reload.bad && cp reload.yaml reload.good && mv reload.bad reload.yaml \
  && hup_until "does not load, nothing changes: .*train.groups_per_step" || fail "reload of a broken config: $(tail -3 reload.log)"
mv reload.good reload.yaml
wait_steps reload 5 && sed -i 's/workers: 3/workers: 1/' reload.yaml && hup_until "rollout.workers 3 -> 1" \
  || fail "reload down: $(tail -3 reload.log)"
wait $pid; rc=$?
[ $rc = 0 ] && grep -q "learner.lr changed; a running job applies only rollout.workers" reload.log \
  && ! grep -q "left (killed" reload.log \
  && ok "reload: SIGHUP with rollout.workers edited 1 -> 3 -> 1; a broken file and other keys change nothing" \
  || fail "reload: rc $rc: $(tail -5 reload.log)"
same_as_clean reload scaleref

# --- rlx k8s render: parse the manifest, then run its Job's pods as local processes ---
"$rlx" k8s render grpo.yaml run.name=k8s --image registry.example/rlx:1 > k8s.yaml 2>k8s.err || fail "k8s render: $(cat k8s.err)"
pods=$(python3 - k8s.yaml <<'P'
import sys, yaml
docs = [d for d in yaml.safe_load_all(open(sys.argv[1])) if d]
assert [d["kind"] for d in docs] == ["Service", "ConfigMap", "Job"], [d["kind"] for d in docs]
svc, cm, job = docs
assert svc["spec"]["clusterIP"] == "None" and svc["spec"]["selector"] == {"rlx/run": "k8s"}
spec = job["spec"]
assert spec["completionMode"] == "Indexed" and spec["completions"] == spec["parallelism"] == 4, spec  # hub + learner + 2 workers
pod = spec["template"]["spec"]
assert pod["subdomain"] == svc["metadata"]["name"] and pod["restartPolicy"] == "Never"
assert spec["template"]["metadata"]["labels"]["rlx/run"] == "k8s"
c = pod["containers"][0]
assert c["image"] == "registry.example/rlx:1" and c["command"][:2] == ["rlx", "run"], c
env = {e["name"]: e for e in c["env"]}
assert env["RLX_TASK_INDEX"]["valueFrom"]["fieldRef"]["fieldPath"].endswith("job-completion-index']")
assert all(isinstance(e.get("value", ""), str) for e in c["env"]), "env values must be strings"
mounts = {m["mountPath"]: m["name"] for m in c["volumeMounts"]}
volumes = {v["name"]: v for v in pod["volumes"]}
assert volumes[mounts["/etc/rlx"]]["configMap"]["name"] == cm["metadata"]["name"]
assert "/dev/shm" in mounts and "/runs" in mounts
config = yaml.safe_load(cm["data"]["config.yaml"])
assert config["run"]["out_dir"] == "/runs" and config["rollout"]["workers"] == 2
open("k8s-config.yaml", "w").write(cm["data"]["config.yaml"])
print(env["RLX_NUM_TASKS"]["value"], env["RLX_TASK_GROUP"]["value"], " ".join(c["command"][3:]))
P
) && ok "k8s render: Service (headless), ConfigMap, Indexed Job of 4 pods" || fail "k8s manifest"
read -r ntasks group extra <<<"$pods"
pids=()
for i in $(seq 0 $((ntasks - 1))); do
  # shellcheck disable=SC2086
  RLX_TASK_INDEX=$i RLX_NUM_TASKS=$ntasks RLX_TASK_GROUP=$group "$rlx" run k8s-config.yaml run.out_dir=runs $extra > "k8s-$i.log" 2>&1 &
  pids+=($!)
done
rcs=""; for p in "${pids[@]}"; do wait "$p"; rcs="$rcs$?"; done
[ "$rcs" = 0000 ] && grep -q "task 0/4: hub 0.*done" k8s-0.log && ok "k8s: the Job's 4 pods as processes ran the plan" \
  || fail "k8s pods: exit codes $rcs: $(tail -3 k8s-0.log)"
same_as_clean k8s
# shellcheck source=checks.sh
source "$here/checks.sh"
bad=$(workers_stopped_first runs/k8s)
[ -z "$bad" ] && [ -f runs/k8s/tasks/*/worker-1-ended ] && ok "k8s: the workers stopped before the hub, none waiting on it" \
  || fail "k8s: a worker waited on a stopped hub: $bad"

# --- a trainer of one's own (examples/reverse_trainer.cpp): its environment in every role and env server ---
if [ -n "$trainer" ]; then
  out=$("$trainer" run grpo.yaml run.name=mine env.name=reversd 2>&1); rc=$?
  [ $rc = 2 ] && grep -q "env.name: unknown environment 'reversd'.*did you mean 'reverse'" <<<"$out" && [ ! -d runs/mine ] \
    && ok "trainer: an unknown environment fails before any process, naming env.name" || fail "trainer env.name: rc $rc: $out"
  "$trainer" run grpo.yaml run.name=mine env.name=reverse 'env.options={}' env.servers=1 train.steps=3 > mine.log 2>&1; rc=$?
  [ $rc = 0 ] && [ -f runs/mine/final/model.safetensors ] && exactly_once runs/mine >/dev/null \
    && ! grep -q "error" runs/mine/logs/worker-*/rank-0.err \
    && [ "$(grep -c '"reversed_pct"' runs/mine/metrics.jsonl)" = 3 ] \
    && grep -q "reverse_trainer: step 3 checkpointed in .*step_00000003" runs/mine/logs/learner-*/rank-0.err \
    && ok "trainer: reverse_trainer ran its own environment behind sandboxed env servers; its hooks ran" \
    || fail "trainer run: rc $rc: $(tail -3 mine.log; grep -h error runs/mine/logs/worker-*/rank-0.err | tail -2)"
fi

# --- a dataset with a task the environment rejects: that lease ends as a data error, the run goes on ---
python3 - <<'P' > tasks.jsonl
import json
print(json.dumps({"prompt": "Compute 1 + 1.\n"}))  # no answer
for i in range(40):
    a, b = i % 10, (i * 7) % 10
    print(json.dumps({"prompt": f"Compute {a} + {b}. Give the final answer as a number.\n", "answer": a + b}))
P
"$rlx" run grpo.yaml run.name=baddata hub.dataset=tasks.jsonl hub.shuffle=false train.steps=3 > baddata.log 2>&1 \
  && grep -q "lease [0-9]* (prompt 0): data error: .*answer" runs/baddata/logs/worker-*/rank-0.err \
  && ok "a bad task: a data error naming the prompt and the field; the run completes" \
  || fail "bad task: $(tail -3 baddata.log; grep -h error runs/baddata/logs/*/rank-0.err | tail -3)"

# --- SFT warm start, then its greedy held-out accuracy through `rlx eval` ---
sft_json=$("$rlx" sft grpo.yaml run.name=sft sft.steps=3 sft.batch=8 sft.eval_tasks=8 2>sft.log | tail -n 1)
[ -f runs/sft/final/model.safetensors ] && [ -f runs/sft/final/tokenizer.json ] && ok "sft: final model and tokenizer" \
  || fail "sft: no final model: $(tail -3 sft.log)"
eval_json=$("$rlx" eval grpo.yaml model.path=runs/sft/final sft.eval_tasks=8 | tail -n 1)
python3 - "$sft_json" "$eval_json" <<'P' && ok "eval: same held-out accuracy as sft reported" || fail "eval: $sft_json vs $eval_json"
import json, sys
s, e = json.loads(sys.argv[1]), json.loads(sys.argv[2])
assert 0 <= s["accuracy_after"] <= 1 and e["tasks"] == 8, (s, e)
assert abs(s["accuracy_after"] - e["accuracy"]) < 1e-9, (s, e)
P

# --- every example config runs (2 short steps; the arithmetic ones from the SFT warm start above) ---
examples=$(cd "$here/../../examples/configs" && pwd)
for c in grpo_arithmetic ppo_arithmetic distill_arithmetic grpo_code grpo_calculator; do
  warm=(); [[ $c == *arithmetic ]] && warm=("model.path=$PWD/runs/sft/final")
  [[ $c == distill* ]] && warm+=("algorithm.teacher=$PWD/runs/sft/final")
  [[ $c == grpo_code ]] && warm+=("env.options.data=$examples/../data/code_stdio.jsonl")
  "$rlx" run "$examples/$c.yaml" run.out_dir=examples "${warm[@]}" train.steps=2 train.groups_per_step=2 hub.group_size=4 rollout.max_new_tokens=24 run.threads=1 > "example-$c.log" 2>&1 \
    && [ -f "examples/$c/final/model.safetensors" ] && ok "example $c.yaml runs" || fail "example $c: $(tail -3 "example-$c.log")"
done

echo "$failures failures"
[ "$failures" = 0 ]
