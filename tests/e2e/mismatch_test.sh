#!/usr/bin/env bash
# Sampler/learner mismatch correction end to end: the e2e GRPO run, asynchronous (samples up
# to one version behind, so the learner's log-probs differ from the sampler's), once per
# `algorithm.mismatch` mode. Each run must finish its steps and report the mismatch every
# step; the mask modes, with a narrow band, must drop tokens; `none` must drop none and
# weigh every token 1; the truncating modes must drop none and weigh no token above the cap.
#   mismatch_test.sh RLX_BINARY WORK_DIR
set -uo pipefail
rlx=$1 work=$2 here=$(cd "$(dirname "$0")" && pwd)
rm -rf "$work" && mkdir -p "$work" && cd "$work"
cp "$here/grpo.yaml" grpo.yaml
failures=0
for spec in none:0:2 token_truncate:0:1.001 token_mask:0.999:1.001 sequence_truncate:0:1.001 \
            sequence_mask:0.999:1.001 icepop:0.999:1.001; do
  IFS=: read -r mode low high <<<"$spec"
  "$rlx" run grpo.yaml run.name="$mode" train.mode=async train.steps=8 learner.checkpoint_every=0 \
    algorithm.mismatch="$mode" algorithm.mismatch_low="$low" algorithm.mismatch_high="$high" > "$mode.log" 2>&1 \
    || { failures=$((failures + 1)); echo "FAIL: $mode: $(tail -5 "$mode.log")"; continue; }
  python3 - "runs/$mode/metrics.jsonl" "$mode" "$high" <<'P' && echo "ok: $mode" || { failures=$((failures + 1)); echo "FAIL: $mode"; }
import json, math, sys
m = [json.loads(l) for l in open(sys.argv[1])]
mode, high = sys.argv[2], float(sys.argv[3])
assert [x["step"] for x in m] == list(range(1, 9)), [x["step"] for x in m]
keys = ("mismatch_kl", "mismatch_masked_fraction", "mismatch_weight_mean", "mismatch_ratio_p01",
        "mismatch_ratio_p50", "mismatch_ratio_p99")
for x in m:
    assert all(k in x and math.isfinite(x[k]) for k in keys), {k: x.get(k) for k in keys}
    assert 0 <= x["mismatch_masked_fraction"] <= 1 and x["mismatch_kl"] >= 0, x
    assert x["mismatch_ratio_p01"] <= x["mismatch_ratio_p50"] <= x["mismatch_ratio_p99"], x
masked = [x["mismatch_masked_fraction"] for x in m]
lagged = [x for x in m if x["version_lag"] > 0]
assert lagged, "no step trained on samples of an older version: nothing to correct"
if mode == "none":
    assert all(f == 0 for f in masked) and all(x["mismatch_weight_mean"] == 1 for x in m), m
elif mode.endswith("truncate"):
    assert all(f == 0 for f in masked), masked
    assert all(x["mismatch_weight_mean"] <= high + 1e-9 for x in m), [x["mismatch_weight_mean"] for x in m]
else:
    assert max(masked) > 0, f"{mode}: no token left the band [0.999, 1.001]: {masked}"
print(mode, "masked", [round(f, 3) for f in masked], "p50", [round(x["mismatch_ratio_p50"], 4) for x in m])
P
done
# A bad band is refused before any process starts, naming the keys.
out=$("$rlx" run grpo.yaml algorithm.mismatch=icepop 2>&1); rc=$?
[ $rc = 2 ] && grep -q "mismatch_low" <<<"$out" && echo "ok: icepop without a lower bound is refused" \
  || { failures=$((failures + 1)); echo "FAIL: icepop without mismatch_low: rc $rc: $out"; }
out=$("$rlx" run grpo.yaml algorithm.tis_cap=2 algorithm.mismatch=token_mask 2>&1); rc=$?
[ $rc = 2 ] && grep -q "choose one" <<<"$out" && echo "ok: tis_cap with a mismatch mode is refused" \
  || { failures=$((failures + 1)); echo "FAIL: tis_cap and mismatch: rc $rc: $out"; }
exit $failures
