#!/usr/bin/env bash
# Validation during training, end to end: a short sync GRPO run of the math environment on a
# GSM8K-style hub.dataset, validating every 2 steps on a MATH-500-style validation.dataset
# (greedy and 4 samples per task, pass@k for k = 1, 2, 4, 8: 8 > n is left out). Step 0, steps
# 2 and 4 and the last step (5) must carry the val/ keys, with mean@n = pass@1 <= pass@2 <=
# pass@4 <= 1; `rlx eval` must report the same sampled metrics; a bad k is refused.
#   validation_test.sh RLX_BINARY WORK_DIR
set -uo pipefail
rlx=$1 work=$2
# shellcheck source=checks.sh
source "$(cd "$(dirname "$0")" && pwd)/checks.sh"
rm -rf "$work" && mkdir -p "$work" && cd "$work"
failures=0
write_gsm8k train.jsonl
python3 - <<'P'
import json
with open("val.jsonl", "w") as f:
    for i in range(6):
        f.write(json.dumps({"problem": f"What is {i} + {i + 1}?", "answer": str(2 * i + 1)}) + "\n")
P
cat > val.yaml <<'Y'
run: {name: val, out_dir: runs, seed: 1, threads: 1, plots: false}
model: {preset: tiny}
hub: {group_size: 4, dataset: train.jsonl}
env: {name: math}
learner: {lr: 1e-3}
algorithm: {name: grpo}
rollout: {workers: 1, max_new_tokens: 6}
train: {mode: sync, steps: 5, groups_per_step: 2}
validation: {every_steps: 2, dataset: val.jsonl, tasks: 5, samples: 4, temperature: 1.0, k: [1, 2, 4, 8], kv_cache_blocks: 64}
Y
"$rlx" run val.yaml > run.log 2>&1 || { failures=$((failures + 1)); echo "FAIL: the run: $(tail -5 run.log)"; }
python3 - runs/val <<'P' && echo "ok: val/ keys at steps 0, 2, 4, 5; pass@k relations" || { failures=$((failures + 1)); echo "FAIL: the run's val metrics"; }
import json, sys
m = [json.loads(l) for l in open(f"{sys.argv[1]}/metrics.jsonl")]
val = {x["step"]: x for x in m if "val/greedy_acc" in x}
assert sorted(val) == [0, 2, 4, 5], sorted(val)
assert [x["step"] for x in m if "reward_mean" in x] == [1, 2, 3, 4, 5]
for s, x in val.items():
    for k in ("val/greedy_reward", "val/mean@4", "val/maj@4", "val/pass@1", "val/pass@2", "val/pass@4", "val_s"):
        assert k in x, (s, k, x)
    assert "val/pass@8" not in x, x  # k > n is left out
    assert x["val/tasks"] == 5 and x["val/sampled_tasks"] == 5 and x["val/errors"] == 0 and x["val/cut_short"] == 0, x
    assert abs(x["val/pass@1"] - x["val/mean@4"]) < 1e-9, x
    assert x["val/pass@1"] <= x["val/pass@2"] + 1e-12 <= x["val/pass@4"] + 2e-12 <= 1 + 1e-9, x
    for k in ("val/greedy_acc", "val/maj@4"):
        assert 0 <= x[k] <= 1, x
print({s: round(x["val/pass@4"], 3) for s, x in val.items()}, "val_s", [round(x["val_s"], 2) for x in val.values()])
P
grep -q "val acc" run.log && echo "ok: the console line shows val acc" || { failures=$((failures + 1)); echo "FAIL: no val acc on the console"; }
out=$("$rlx" eval val.yaml model.path=runs/val/final sft.eval_tasks=4 validation.samples=4 'validation.k=[1,4]' 2>/dev/null | tail -1)
python3 -c "
import json, sys
r = json.loads(sys.argv[1])
assert r['tasks'] == 4 and 0 <= r['accuracy'] <= 1, r
assert r['pass@1'] <= r['pass@4'] <= 1 and abs(r['pass@1'] - r['mean@4']) < 1e-9 and 'maj@4' in r, r
" "$out" && echo "ok: rlx eval reports mean@n, pass@k, maj@n" || { failures=$((failures + 1)); echo "FAIL: rlx eval: $out"; }
out=$("$rlx" run val.yaml 'validation.k=[0]' 2>&1); rc=$?
[ $rc = 2 ] && grep -q "k\[0\]" <<<"$out" && echo "ok: validation.k=[0] is refused" \
  || { failures=$((failures + 1)); echo "FAIL: validation.k=[0]: rc $rc: $out"; }
exit $failures
