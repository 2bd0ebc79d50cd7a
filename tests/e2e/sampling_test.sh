#!/usr/bin/env bash
# The sampling and filtering settings and what a run shows of its samples, end to end: a
# short asynchronous CISPO run of the math environment on a GSM8K-style file given as
# hub.dataset ({"question", "answer"} lines), with top_p / top_k / min_p / stop / seed,
# partial rollouts (update_policy continue), DAPO's overlong filtering (mask_truncated) and
# samples logged every 2 steps. The run must finish; every step's line must carry the
# environment's counters and the truncated share; samples.jsonl and TensorBoard's text tab
# must hold the logged samples. A bad setting is refused before any process starts.
#   sampling_test.sh RLX_BINARY WORK_DIR
set -uo pipefail
rlx=$1 work=$2
# shellcheck source=checks.sh
source "$(cd "$(dirname "$0")" && pwd)/checks.sh"
rm -rf "$work" && mkdir -p "$work" && cd "$work"
failures=0
write_gsm8k gsm8k.jsonl
cat > sampling.yaml <<'Y'
run: {name: sampling, out_dir: runs, seed: 1, threads: 1, plots: false}
model: {preset: tiny}
hub: {group_size: 4, dataset: gsm8k.jsonl}
env: {name: math}
learner: {lr: 1e-3}
algorithm: {name: cispo, clip_low: 0.999, clip_high: 2, mask_truncated: true}
rollout:
  workers: 1
  max_new_tokens: 6
  top_p: 0.9
  top_k: 20
  min_p: 0.05
  stop: ["\n\n"]
  seed: 3
  update_policy: continue
train: {mode: async, steps: 4, groups_per_step: 2}
log: {samples_every: 2, samples_per_step: 3}
Y
"$rlx" run sampling.yaml > run.log 2>&1 || { failures=$((failures + 1)); echo "FAIL: the run: $(tail -5 run.log)"; }
python3 - runs/sampling <<'P' && echo "ok: counters, truncation, samples.jsonl, text events" || { failures=$((failures + 1)); echo "FAIL: the run's outputs"; }
import glob, json, math, sys
d = sys.argv[1]
m = [json.loads(l) for l in open(f"{d}/metrics.jsonl")]
assert [x["step"] for x in m] == [1, 2, 3, 4], [x["step"] for x in m]
for x in m:
    for k in ("env_errors_unextracted", "env_errors_unparsed", "env_errors_unextracted_mean", "truncated_fraction"):
        assert k in x and math.isfinite(x[k]), (k, x)
    assert 0 <= x["truncated_fraction"] <= 1, x
    assert x["env_errors_unextracted"] == round(x["env_errors_unextracted"]), x  # a count
s = [json.loads(l) for l in open(f"{d}/samples.jsonl")]
assert sorted({x["step"] for x in s}) == [2, 4], [x["step"] for x in s]
assert len(s) == 6, len(s)
for x in s:
    assert "How many now?" in x["prompt"], x
    assert x["finish"] in ("stop", "length", "turns") and x["version"] >= 0, x
    assert x["info"]["outcome"] in ("correct", "wrong", "unextracted", "unparsed", "limit"), x
    assert x["info"]["reference"].isdigit(), x
events = b"".join(open(f, "rb").read() for f in glob.glob(f"{d}/tensorboard/events.out.tfevents.*"))
assert events.count(b"How many now?") >= 6 and b"text" in events, "no samples in TensorBoard's text events"
print("truncated", [x["truncated_fraction"] for x in m], "unextracted", [x["env_errors_unextracted"] for x in m])
P
# Bad settings are refused before any process starts, naming the key.
for bad in rollout.top_p=0 rollout.update_policy=abort 'rollout.stop=[""]' log.samples_every=-1; do
  out=$("$rlx" run sampling.yaml "$bad" 2>&1); rc=$?
  key=${bad%%=*}
  [ $rc = 2 ] && grep -q "${key#*.}" <<<"$out" && echo "ok: $bad is refused" \
    || { failures=$((failures + 1)); echo "FAIL: $bad: rc $rc: $out"; }
done
exit $failures
