#!/usr/bin/env bash
# The main job, on CPU: install, build, warm-start a tiny Qwen2-shaped model on
# arithmetic with SFT (reused when it exists), then train it with GRPO as separate
# processes — the replay hub, the learner, a rollout worker and its sandboxed env
# server — and report the held-out accuracy before and after, with plots.
#
#   scripts/quickstart.sh                 # everything
#   RLX_STEPS=40 scripts/quickstart.sh    # a shorter GRPO run
set -euo pipefail
root=$(cd "$(dirname "$0")/.." && pwd)
build=${RLX_BUILD_DIR:-$root/build/release}
runs=${RLX_RUNS_DIR:-$root/runs}
"$root/scripts/install-deps.sh" --main-job
mkdir -p "$(dirname "$build")" "$runs"
echo "== 0. build the rlx command (rlx_cli and what it links; scripts/test.sh builds the rest)"
"$root/scripts/build.sh" "$build" rlx_cli
rlx="$build/rlx"
cd "$root"
sft_cfg=examples/configs/sft_arithmetic.yaml grpo_cfg=examples/configs/grpo_arithmetic.yaml
warm="$runs/sft_arithmetic/final"

echo "== 1. SFT warm start ($sft_cfg)"
if [ -f "$warm/model.safetensors" ] && [ -f "$warm/tokenizer.json" ]; then
  echo "reusing the warm start in $warm (delete it to make it again)"
else
  "$rlx" sft "$sft_cfg" "run.out_dir=$runs"
fi

echo "== 2. held-out accuracy of the warm start (greedy)"
before=$("$rlx" eval "$grpo_cfg" "model.path=$warm" | tail -n 1)
echo "$before"

echo "== 3. GRPO: hub + learner + rollout worker + sandboxed env server ($grpo_cfg)"
"$rlx" run "$grpo_cfg" "run.out_dir=$runs" "model.path=$warm" ${RLX_STEPS:+train.steps=$RLX_STEPS} --force

echo "== 4. held-out accuracy after GRPO (greedy)"
after=$("$rlx" eval "$grpo_cfg" "model.path=$runs/grpo_arithmetic/final" | tail -n 1)
echo "$after"

plots="$runs/grpo_arithmetic/plots"  # `rlx run` wrote them at its end (run.plots)
python3 - "$before" "$after" "$plots" "$runs/grpo_arithmetic" <<'P'
import json, sys
b, a = json.loads(sys.argv[1])["accuracy"], json.loads(sys.argv[2])["accuracy"]
print(f"quickstart: held-out accuracy {b:.3f} -> {a:.3f} after GRPO")
print(f"quickstart: metrics {sys.argv[4]}/metrics.jsonl, plots in {sys.argv[3]}, model {sys.argv[4]}/final")
P
