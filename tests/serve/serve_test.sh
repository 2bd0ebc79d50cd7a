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
