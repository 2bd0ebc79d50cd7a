#!/usr/bin/env bash
# rlx serve's HTTP overhead: the same generation shapes through rlx serve (concurrent
# /v1/completions requests from Node, scripts/bench_serve.js) and through the engine alone
# (rlx bench sampler), same model, engine settings and threads. Last line: JSON with both
# and their ratio.
#   scripts/bench_serve.sh RLX MODEL_DIR [BATCH PROMPT NEW N ITERS THREADS]
set -euo pipefail
here=$(cd "$(dirname "$0")" && pwd)
rlx=${1:?usage: bench_serve.sh RLX MODEL_DIR [BATCH PROMPT NEW N ITERS THREADS]}
model=${2:?model directory}
batch=${3:-16} prompt=${4:-64} new=${5:-64} n=${6:-1} iters=${7:-3} threads=${8:-2}
vocab=$(python3 -c "import json,sys; print(json.load(open(sys.argv[1]))['vocab_size'])" "$model/config.json")
log=$(mktemp)
"$rlx" serve --model "$model" --served-model-name bench --port 0 --threads "$threads" --max-in-flight 256 --max-n 64 > "$log" 2>&1 &
pid=$!
trap 'kill $pid 2>/dev/null || true; rm -f "$log"' EXIT
for _ in $(seq 1 600); do
  port=$(grep -oE 'listening on http://127.0.0.1:[0-9]+' "$log" | grep -oE '[0-9]+$' || true)
  [ -n "$port" ] && break
  kill -0 $pid 2>/dev/null || { cat "$log"; exit 1; }
  sleep 0.1
done
url="http://127.0.0.1:$port/v1"
served=$(node "$here/bench_serve.js" "$url" bench "$vocab" "$batch" "$prompt" "$new" "$n" "$iters" | tail -1)
streamed=$(node "$here/bench_serve.js" "$url" bench "$vocab" "$batch" "$prompt" "$new" "$n" "$iters" stream | tail -1)
kill $pid; wait $pid || true
engine=$("$rlx" bench sampler --model "$model" --batch "$batch" --prompt "$prompt" --new "$new" --n "$n" --iters "$iters" \
  --threads "$threads" --temperature 1 --kv-cache-mb 256 --max-batch-tokens 2048 | tail -1)  # rlx serve's engine settings
python3 - "$served" "$streamed" "$engine" <<'PY'
import json, sys
served, streamed, engine = (json.loads(x) for x in sys.argv[1:4])
e = engine["output_tokens_per_s"]
print(f"rlx serve: {served['tokens_per_s']:.0f} tokens/s ({served['tokens_per_s'] / e:.2f}x the engine), "
      f"streamed {streamed['tokens_per_s']:.0f} ({streamed['tokens_per_s'] / e:.2f}x); engine alone {e:.0f} tokens/s")
print(json.dumps({"bench": "serve_vs_engine", "serve_tokens_per_s": served["tokens_per_s"],
                  "serve_stream_tokens_per_s": streamed["tokens_per_s"], "engine_tokens_per_s": e,
                  "serve_ratio": served["tokens_per_s"] / e, "stream_ratio": streamed["tokens_per_s"] / e,
                  "batch": served["batch"], "prompt": served["prompt"], "new": served["new"], "n": served["n"]}))
PY
