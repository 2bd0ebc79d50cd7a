#!/usr/bin/env bash
# Rollout routing replay end to end with real processes, on the tiny mixture-of-experts
# model (2 sparse layers, top 2 of 8 experts):
# - a multi-turn GRPO run with routing replay stores, for every sample, the experts of each
#   token the engine forwarded; its learner's router agrees with them;
# - the same run with its rollout worker SIGKILLed after an episode checkpoint: the worker
#   that takes the lease over continues the episodes, routing and all, and the run ends
#   with the same parameters and the same stored routing;
# - with the learner in bfloat16 (the sampler in fp32) the routers disagree on some rows,
#   with and without replay (that replay lowers mismatch_kl is measured on one batch in
#   tests/unit/learner/routing_stats_test.cpp: here two runs' batches differ after a step).
#   moe_replay_test.sh RLX_BINARY WORK_DIR
set -uo pipefail
rlx=$1 work=$2 here=$(cd "$(dirname "$0")" && pwd)
rm -rf "$work" && mkdir -p "$work" && cd "$work"
cp "$here/grpo.yaml" grpo.yaml
failures=0
fail() { failures=$((failures + 1)); echo "FAIL: $*"; }
ok() { echo "ok: $*"; }
dump() { "$rlx" inspect trajectories "runs/$1/trajectories.h5" --dump 1000 | grep '^{"'; }

moe="model.preset=tiny-moe model.arch=qwen3_moe algorithm.routing_replay=true"
long="env.name=guess_number env.max_turns=4 env.servers=1 rollout.max_new_tokens=6 rollout.workers=1 train.steps=2
  learner.checkpoint_every=0 rollout.episode_checkpoint_turns=1"
# shellcheck disable=SC2086
"$rlx" run grpo.yaml run.name=long $moe $long > long.log 2>&1 || fail "long: $(tail -3 long.log)"
dump long > long.jsonl
python3 - long.jsonl runs/long/metrics.jsonl <<'P' && ok "long: every sample's routing covers its tokens; the learner's router agrees" \
  || fail "long: routing in trajectories.h5 or moe metrics"
import json, sys
samples = [t for l in open(sys.argv[1]) for t in json.loads(l)["samples"]]
assert samples
recorded = rows = 0
for t in samples:
    r = t["routing"]
    assert r["layers"] == 2 and r["top_k"] == 2, r
    e = r["experts"]
    assert len(e) == len(t["tokens"]) * 4, (len(e), len(t["tokens"]))
    assert all(-1 <= x < 8 for x in e)
    assert e[-4:] == [-1] * 4, "the last token was never forwarded"
    rows += len(t["tokens"]) - 1
    recorded += sum(1 for i in range(len(t["tokens"]) - 1) if e[4 * i] >= 0)
assert recorded / rows > 0.9, (recorded, rows)  # a turn's unforwarded observations only
m = [json.loads(l) for l in open(sys.argv[2])]
assert len(m) == 2, m
for x in m:
    assert x["moe/routing_agreement"] >= 0.99, x["moe/routing_agreement"]
    assert x["moe/load_max_over_mean"] >= 1 and 0 < x["moe/router_entropy"] <= 2.08, x
print(len(samples), "samples,", recorded, "of", rows, "rows recorded; agreement", [x["moe/routing_agreement"] for x in m])
P

# shellcheck disable=SC2086
RLX_FAULT=kill-after-episode-checkpoint:0:3 "$rlx" run grpo.yaml run.name=longkill $moe $long > longkill.log 2>&1 \
  && grep -q "worker 0 ended: killed by signal 9" longkill.log && [ -f runs/longkill/fault-injected ] \
  && grep -q "continues its episodes at turn [1-3]" runs/longkill/logs/worker-0.*/rank-0.err \
  && ok "longkill: a worker killed after an episode checkpoint; its successor continued the episodes mid-way" \
  || fail "longkill: $(tail -3 longkill.log; tail -3 runs/longkill/logs/worker-0*/rank-0.err)"
cmp -s runs/long/final/model.safetensors runs/longkill/final/model.safetensors \
  && ok "longkill: final parameters equal the run without the kill" || fail "longkill: final parameters differ"
dump longkill > longkill.jsonl
grep -ho "(prompt [0-9]*): continues its episodes" runs/longkill/logs/worker-0*/rank-0.err | grep -o "[0-9]*" > continued
python3 - long.jsonl longkill.jsonl continued <<'P' && ok "longkill: the groups continued from checkpoints, and every other, carry the routing of the run without the kill" \
  || fail "longkill: routing differs from the run without the kill"
import json, sys
def groups(path):
    return {(g["epoch"], g["prompt_index"]): [t["routing"] for t in g["samples"]] for g in map(json.loads, open(path))}
a, b = groups(sys.argv[1]), groups(sys.argv[2])
continued = {(0, int(p)) for p in open(sys.argv[3]).read().split()}
assert continued and continued <= a.keys() & b.keys(), (continued, sorted(a), sorted(b))
both = a.keys() & b.keys()  # a run may store a group or two past its last step
assert len(both) >= len(a) - 2, (sorted(a), sorted(b))
for k in both:
    assert a[k] == b[k], k
print(len(both), "groups compared;", sorted(p for _, p in continued), "continued")
P

# Two workers: the killed worker's episodes are continued by whichever worker takes the
# lease next, the other one or its own successor; the run still ends as without the kill.
# shellcheck disable=SC2086
"$rlx" run grpo.yaml run.name=long2 $moe $long rollout.workers=2 > long2.log 2>&1 || fail "long2: $(tail -3 long2.log)"
# shellcheck disable=SC2086
RLX_FAULT=kill-after-episode-checkpoint:0:3 "$rlx" run grpo.yaml run.name=longkill2 $moe $long rollout.workers=2 \
  > longkill2.log 2>&1 && grep -q "worker 0 ended: killed by signal 9" longkill2.log \
  && by=$(grep -l "continues its episodes at turn [1-3]" runs/longkill2/logs/worker-*/rank-0.err) \
  && cmp -s runs/long2/final/model.safetensors runs/longkill2/final/model.safetensors \
  && ok "longkill2: episodes continued by $(echo $by | sed 's|runs/longkill2/logs/||g; s|/rank-0.err||g'); final parameters as without the kill" \
  || fail "longkill2: $(tail -3 longkill2.log)"

# The learner in bfloat16, the sampler in fp32: the routers disagree on some tokens.
kl() {  # kl NAME REPLAY: the mean mismatch_kl and routing agreement of a 4-step run
  "$rlx" run grpo.yaml run.name="$1" model.preset=tiny-moe model.arch=qwen3_moe algorithm.routing_replay="$2" learner.compute_dtype=bfloat16 \
    rollout.workers=1 train.steps=4 learner.checkpoint_every=0 > "$1.log" 2>&1 || { fail "$1: $(tail -3 "$1.log")"; return; }
  python3 -c '
import json, sys
m = [json.loads(l) for l in open(sys.argv[1])]
print(sum(x["mismatch_kl"] for x in m) / len(m), sum(x["moe/routing_agreement"] for x in m) / len(m))' "runs/$1/metrics.jsonl"
}
read -r kl_free agree_free <<<"$(kl bf16free false)"
read -r kl_replay agree_replay <<<"$(kl bf16replay true)"
python3 -c '
import sys
kl_free, agree_free, kl_replay, agree_replay = map(float, sys.argv[1:])
assert 0.9 < agree_free < 1 and 0.9 < agree_replay < 1, (agree_free, agree_replay)
assert kl_free >= 0 and kl_replay >= 0, (kl_free, kl_replay)
' "$kl_free" "$agree_free" "$kl_replay" "$agree_replay" \
  && ok "bfloat16 learner: agreement $agree_free (routing itself) / $agree_replay (replay); mismatch_kl $kl_free / $kl_replay" \
  || fail "bfloat16 learner: agreement $agree_free / $agree_replay, mismatch_kl $kl_free -> $kl_replay"
# Replay with nothing recorded is refused before any process starts, naming both keys.
out=$("$rlx" run grpo.yaml run.name=norecord $moe rollout.record_routing=false 2>&1); rc=$?
[ $rc = 2 ] && grep -q "algorithm.routing_replay" <<<"$out" && grep -q "rollout.record_routing" <<<"$out" && [ ! -d runs/norecord ] \
  && ok "routing_replay without rollout.record_routing is refused" || fail "norecord: rc $rc: $out"
exit $failures
