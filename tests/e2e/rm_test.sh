#!/usr/bin/env bash
# Reward models end to end: `rlx rm` trains one from the environment's pairs (a task's answer
# against another's) and from a JSONL file of {prompt, chosen, rejected}, its held-out pairwise
# accuracy rising from a coin flip; it writes an HF sequence classifier; `rlx run` with
# reward_model.path scores every episode with it on the rollout side (reward = env_coef x env +
# coef x score), split and colocated; bad data and a missing directory are refused by name.
#   rm_test.sh RLX_BINARY WORK_DIR
set -uo pipefail
rlx=$1 work=$2 here=$(cd "$(dirname "$0")" && pwd)
rm -rf "$work" && mkdir -p "$work" && cd "$work"
cp "$here/grpo.yaml" grpo.yaml
fast=(learner.micro_batch_tokens=4096 learner.row_tokens=256)
failures=0
fail() { failures=$((failures + 1)); echo "FAIL: $*"; }
ok() { echo "ok: $*"; }

"$rlx" sft grpo.yaml run.name=sft sft.steps=150 sft.batch=32 sft.lr=2e-3 sft.eval_tasks=50 "${fast[@]}" > /dev/null 2>sft.log \
  || { echo "FAIL: sft: $(tail -3 sft.log)"; exit 1; }
# A learning claim (docs/NUMERICS.md): over run.seed 0-5 at 300 steps (cpu2, 2026-11-27, at
# cd4e817) the held-out accuracy on 200 pairs read 0.66, 0.73, 0.745, 0.755, 0.80, 0.83: mean 0.753,
# sd 0.059 (at 150 steps: mean 0.693, sd 0.044, and 0.635 for seed 3, under the old bound of
# 0.65). The bound, 0.58, is 2.9 sd below the mean; on 1000 pairs the spread is smaller and 0.58
# is 5 binomial sd above a coin flip.
out=$("$rlx" rm grpo.yaml run.name=rm model.path=runs/sft/final rm.steps=300 rm.lr=1e-3 rm.eval_pairs=1000 "${fast[@]}" \
  2>rm.log | tail -n 1)
python3 - "$out" runs/rm <<'P' && ok "rlx rm: the environment's pairs, held-out pairwise accuracy rises" || fail "rm: $(tail -3 rm.log)"
import json, pathlib, sys
r, run = json.loads(sys.argv[1]), pathlib.Path(sys.argv[2])
print(f"held-out pairwise accuracy {r['accuracy_before']:.3f} -> {r['accuracy_after']:.3f} ({r['eval_pairs']} pairs)")
assert r["accuracy_before"] == 0.5 and r["accuracy_after"] >= 0.58, r  # a zero head ties every pair
cfg = json.loads((run / "final" / "config.json").read_text())
assert cfg["architectures"] == ["LlamaForSequenceClassification"] and len(cfg["id2label"]) == 1, cfg  # tiny: llama
m = [json.loads(l) for l in open(run / "metrics.jsonl")]
assert len(m) == 300 and sum(x["bt_loss"] for x in m[-25:]) < sum(x["bt_loss"] for x in m[:25]), m[-1]
assert (run / "final" / "tokenizer.json").exists()
P

# A JSONL file of preferences: the chosen completion repeats the prompt's digit, the rejected one does not.
python3 - <<'P'
import json, random
rng = random.Random(0)
with open("prefs.jsonl", "w") as f:
    for i in range(400):
        d, e = rng.sample("0123456789", 2)
        f.write(json.dumps({"prompt": f"{d}=", "chosen": f"{d}{d}", "rejected": f"{d}{e}"}) + "\n")
P
# A learning claim (docs/NUMERICS.md): the held-out accuracy moves with the CPU's rounding. At
# 200 steps it read 0.97 (SkylakeX BLAS), 1.0 (Prescott), 0.89 (Haswell), 1.0 and 0.97
# (ATEN_CPU_CAPABILITY default, avx2) on cpu2, 2026-11-27: mean 0.97, sd 0.04. The bound, 0.75,
# is 5 sd below. (At 100 steps those read 0.82 to 0.97, and the old bound of 0.9 failed.)
out=$("$rlx" rm grpo.yaml run.name=rmfile model.path=runs/sft/final rm.data=prefs.jsonl rm.steps=200 rm.lr=2e-3 \
  rm.eval_pairs=100 "${fast[@]}" 2>rmfile.log | tail -n 1)
python3 - "$out" <<'P' && ok "rlx rm: pairs from rm.data, the last rm.eval_pairs held out" || fail "rm data: $(tail -3 rmfile.log)"
import json, sys
r = json.loads(sys.argv[1])
print(f"held-out pairwise accuracy {r['accuracy_before']:.3f} -> {r['accuracy_after']:.3f} ({r['eval_pairs']} pairs)")
assert r["eval_pairs"] == 100 and r["accuracy_after"] >= 0.75, r
P
printf '{"prompt": "1=", "chosen": "11"}\n' > bad.jsonl
out=$("$rlx" rm grpo.yaml run.name=bad rm.data=bad.jsonl 2>&1); rc=$?
[ $rc != 0 ] && grep -q "bad.jsonl line 1: no string \"rejected\"" <<<"$out" && ok "bad preference data is named by file and line" \
  || fail "bad data: rc $rc: $out"

# --- the reward model scores the episodes of a run ---
for placement in split colocated; do
  "$rlx" run grpo.yaml run.name=scored-$placement model.path=runs/sft/final reward_model.path=runs/rm/final \
    reward_model.env_coef=0 train.steps=6 train.placement=$placement rollout.workers=1 > scored-$placement.log 2>&1 \
    || fail "scored $placement: $(tail -3 scored-$placement.log)"
done
python3 - runs/scored-split runs/scored-colocated <<'P' && ok "rollout: each episode's reward is the reward model's score" \
  || fail "scored runs"
import json, pathlib, sys
for run in map(pathlib.Path, sys.argv[1:]):
    m = [json.loads(l) for l in open(run / "metrics.jsonl")]
    assert len(m) == 6, len(m)
    # The environment's rewards are 0 or 1 over 16 samples a step; the scores are not.
    assert any(abs(x["reward_mean"] * 16 - round(x["reward_mean"] * 16)) > 1e-3 for x in m), [x["reward_mean"] for x in m]
    # The two parts apart: env_coef 0, so the reward is the model's score; the environment's is 0 or 1.
    assert all(abs(x["reward_model_mean"] - x["reward_mean"]) < 1e-5 for x in m), m[-1]
    assert all(0 <= x["reward_env_mean"] <= 1 and abs(x["reward_env_mean"] * 16 - round(x["reward_env_mean"] * 16)) < 1e-6
               for x in m), [x["reward_env_mean"] for x in m]
    logs = "".join(p.read_text() for p in run.glob("logs/*/rank-0.err"))
    assert "reward model" in logs and "0 x env + 1 x score" in logs, logs[-1500:]
P
out=$("$rlx" run grpo.yaml run.name=nowhere reward_model.path=nowhere 2>&1); rc=$?
[ $rc = 2 ] && grep -q "reward_model.path: nowhere is not an HF model directory" <<<"$out" \
  && ok "a missing reward model directory is refused before any process starts" || fail "missing rm: rc $rc: $out"
exit $failures
