#!/usr/bin/env bash
# rlx serve end to end: a tiny model with Qwen3's real tokenizer and chat template, served on
# a free port, driven by the OpenAI Node SDK (openai_sdk_test.js); then SIGTERM stops it
# cleanly.   serve_test.sh RLX_BINARY SOURCE_DIR WORK_DIR CHAT_FIXTURE_DIR
set -euo pipefail
rlx=$1 src=$2 work=$3 fixtures=$4
rm -rf "$work" && mkdir -p "$work" && cd "$work"
[ -f "$fixtures/.complete" ] || { echo "missing $fixtures: run scripts/make_chat_template_fixtures.sh $fixtures"; exit 1; }
"$rlx" model init --preset tiny --tokenizer "$fixtures/qwen3/tokenizer.json" --out model --seed 1 >/dev/null
cp "$fixtures/qwen3/tokenizer_config.json" model/
# rlx chat render: the template's text and the tokenizer's ids; a bad message names itself.
printf '[{"role": "system", "content": "Be brief."}, {"role": "user", "content": "Hi!"}]' > chat.json
out=$("$rlx" chat render --tokenizer-dir "$fixtures/qwen3" --messages chat.json --var enable_thinking=false --json)
python3 - "$out" <<'P' || { echo "FAIL: rlx chat render: $out"; exit 1; }
import json, sys
r = json.loads(sys.argv[1])
assert r["text"] == "<|im_start|>system\nBe brief.<|im_end|>\n<|im_start|>user\nHi!<|im_end|>\n<|im_start|>assistant\n<think>\n\n</think>\n\n", r
assert r["ids"][:3] == [151644, 8948, 198] and r["ids"][-1] == 271, r["ids"]
P
printf '[{"role": "user", "content": 5}]' > bad.json
if out=$("$rlx" chat render --tokenizer-dir "$fixtures/qwen3" --messages bad.json 2>&1); then echo "FAIL: a bad message rendered"; exit 1; fi
grep -q 'messages\[0\]' <<<"$out" || { echo "FAIL: bad message error: $out"; exit 1; }
echo "ok: rlx chat render (text and ids; a bad message named)"
max_body=65536
"$rlx" serve --model model --port 0 --threads 1 --max-body-kb 64 --max-in-flight 16 > serve.log 2>&1 &
pid=$!
trap 'kill -9 $pid 2>/dev/null || true' EXIT
port=""
for _ in $(seq 1 300); do
  port=$(grep -oE 'listening on http://127.0.0.1:[0-9]+' serve.log | grep -oE '[0-9]+$' || true)
  [ -n "$port" ] && break
  kill -0 $pid 2>/dev/null || { echo "rlx serve exited:"; cat serve.log; exit 1; }
  sleep 0.1
done
[ -n "$port" ] || { echo "rlx serve did not start:"; cat serve.log; exit 1; }
node "$src/tests/serve/openai_sdk_test.js" "$fixtures/node_modules" "http://127.0.0.1:$port/v1" model "$max_body"
kill -TERM $pid
rc=0
wait $pid || rc=$?
[ "$rc" = 0 ] || { echo "rlx serve exited $rc after SIGTERM:"; tail -20 serve.log; exit 1; }
grep -q "rlx serve: stopping" serve.log
echo "serve test: passed"
