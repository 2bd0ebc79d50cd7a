#!/usr/bin/env bash
# The rlx CLI as a user runs it: outputs and exit codes.
#   cli_test.sh RLX_BINARY SOURCE_DIR WORK_DIR
set -uo pipefail
rlx=$1 src=$2 work=$3
rm -rf "$work" && mkdir -p "$work" && cd "$work"
failures=0 checks=0

# expect NAME EXIT_CODE PATTERN -- CMD...   (PATTERN is an extended regex over stdout+stderr)
expect() {
  local name=$1 code=$2 pattern=$3; shift 4
  local out rc
  out=$("$@" 2>&1); rc=$?
  checks=$((checks + 1))
  if [ "$rc" != "$code" ] || ! grep -qE -- "$pattern" <<<"$out"; then
    failures=$((failures + 1))
    echo "FAIL: $name: exit $rc (want $code), output:"; echo "$out" | head -20; echo "  (wanted /$pattern/)"
  else
    echo "ok: $name"
  fi
}

expect "version" 0 '^rlx [0-9]+\.[0-9]+\.[0-9]+' -- "$rlx" --version
expect "no subcommand is a usage error" 2 'subcommand' -- "$rlx"

cat > good.yaml <<'Y'
run:
  name: demo
  seed: 3
model:
  preset: small
Y
expect "config show resolves defaults" 0 'preset: small' -- "$rlx" config show good.yaml
expect "config show applies overrides" 0 'seed: 9' -- "$rlx" config show good.yaml run.seed=9
expect "config show prints every section" 0 'tokenizer:' -- "$rlx" config show good.yaml

printf 'run:\n  name: demo\nmodel:\n  preest: small\n' > unknown.yaml
expect "unknown key: exit 2, path, line, suggestion" 2 "model.preest \(unknown.yaml:4\): unknown key; did you mean 'model.preset'" -- "$rlx" config show unknown.yaml
printf 'run:\n  seed: many\n' > type.yaml
expect "wrong type: exit 2, path, line" 2 "run.seed \(type.yaml:2\): expected an integer, got 'many'" -- "$rlx" config show type.yaml
printf 'run:\n  threads: -4\n' > range.yaml
expect "out of range: exit 2" 2 "run.threads \(range.yaml:2\): -4 is out of range: must be in \[0, 1024\]" -- "$rlx" config show range.yaml
expect "bad override: exit 2, command line" 2 "model.dtyp \(command line\): unknown key; did you mean 'model.dtype'" -- "$rlx" config show good.yaml model.dtyp=bfloat16
expect "missing file: exit 2" 2 "cannot read config file nope.yaml" -- "$rlx" config show nope.yaml
printf 'run: [1, 2\n' > syntax.yaml
expect "YAML syntax error: exit 2, line" 2 "syntax.yaml:[0-9]+:[0-9]+: invalid YAML" -- "$rlx" config show syntax.yaml

printf '{"type": "char", "alphabet": "0123456789+=", "special_tokens": ["<pad>", "<bos>", "<eos>", "<unk>"]}\n' > char.json
expect "model init writes an HF directory" 0 'wrote tiny \(qwen2 float32, [0-9]+ parameters, with tokenizer\)' -- \
  "$rlx" model init --arch qwen2 --preset tiny --out tiny --seed 5 --tokenizer char.json
expect "config.json names the architecture" 0 '"Qwen2ForCausalLM"' -- cat tiny/config.json
expect "vocab size follows the tokenizer" 0 '"vocab_size": 16' -- cat tiny/config.json
expect "inspect a valid file" 0 'tensors, [0-9]+ elements, [0-9]+ data bytes, header [0-9]+ bytes: valid' -- "$rlx" inspect safetensors tiny/model.safetensors
expect "inspect lists q/k/v biases for qwen2" 0 'model.layers.0.self_attn.q_proj.bias' -- "$rlx" inspect safetensors tiny/model.safetensors
"$rlx" model init --arch qwen2 --preset tiny --out tiny2 --seed 5 --tokenizer char.json >/dev/null
expect "same seed, same bytes" 0 '' -- cmp tiny/model.safetensors tiny2/model.safetensors
head -c 100 tiny/model.safetensors > truncated.safetensors
expect "inspect a truncated file: exit 1 with the reason" 1 'truncated.safetensors: invalid safetensors: header length [0-9]+ exceeds the 92 bytes after it' -- "$rlx" inspect safetensors truncated.safetensors
printf 'garbage' > short.safetensors
expect "inspect a 7-byte file" 1 'shorter than the 8-byte header length' -- "$rlx" inspect safetensors short.safetensors
expect "unknown preset" 1 "unknown model preset 'tinny'.*did you mean 'tiny'" -- "$rlx" model init --preset tinny --out x

expect "model logits prints JSON of the right shape" 0 '"shape":\[2,3,16\]' -- "$rlx" model logits --model tiny --tokens '[[1,2,3],[4,5,6]]'
expect "model logits rejects ragged input" 1 'equal lengths' -- "$rlx" model logits --model tiny --tokens '[[1,2,3],[4]]'
expect "model logits rejects out-of-vocabulary ids" 1 'token ids must be in \[0, 16\)' -- "$rlx" model logits --model tiny --tokens '[[1,99]]'
expect "tokenize" 0 '^5 6 14 7 15 9$' -- "$rlx" tokenize --tokenizer char.json "12+3=5"
expect "tokenize --decode" 0 '^12\+3=5$' -- "$rlx" tokenize --tokenizer char.json --decode "5 6 14 7 15 9"
expect "tokenize --decode rejects junk" 1 "'x' is not a token id" -- "$rlx" tokenize --tokenizer char.json --decode "5 x"
expect "tokenize --decode rejects unknown ids" 1 'outside the vocabulary' -- "$rlx" tokenize --tokenizer char.json --decode "999"
expect "bench model prints JSON last" 0 '^\{"arch":"llama".*"forward_tokens_per_s"' -- \
  bash -c "'$rlx' bench model --preset tiny --batch 2 --seq 16 --iters 1 --decode-steps 2 --threads 1 | tail -n 1"

expect "generate samples n continuations" 0 'sample 2 \(' -- "$rlx" generate --model tiny --prompt "12+3=" --n 3 --max-tokens 5 --threads 1
expect "generate --json: greedy samples agree" 0 '"tokens":\[([0-9,]+)\].*"tokens":\[\1\]' -- \
  "$rlx" generate --model tiny --prompt "12+3=" --n 2 --max-tokens 6 --temperature 0 --json --threads 1
expect "generate: same seed, same text" 0 '^ok$' -- bash -c "a=\$('$rlx' generate --model tiny --prompt 1 --seed 4 --json); b=\$('$rlx' generate --model tiny --prompt 1 --seed 4 --json); [ \"\$a\" = \"\$b\" ] && echo ok"
expect "generate rejects top-p outside (0, 1]" 1 "request 'prompt': top_p = 1.5 is not in \(0, 1\]" -- "$rlx" generate --model tiny --prompt 1 --top-p 1.5
expect "generate rejects a temperature fp32 cannot sample at" 1 "temperature is 1e-39; it must be 0 \(greedy\) or a finite number >= 0.01" -- "$rlx" generate --model tiny --prompt 1 --temperature 1e-39
expect "generate rejects an empty prompt" 1 "prompt is empty" -- "$rlx" generate --model tiny --prompt ""
expect "generate rejects max tokens 0" 1 "max_new_tokens = 0" -- "$rlx" generate --model tiny --prompt 1 --max-tokens 0
expect "bench sampler prints JSON last" 0 '^\{.*"bench":"sampler".*"speedup_vs_naive"' -- \
  bash -c "'$rlx' bench sampler --batch 4 --prompt 4 --new 4 --iters 1 --naive --threads 1 | tail -n 1"

# The bus commands.
expect "keys generate writes .key and .pub" 0 'k/hub.pub' -- "$rlx" keys generate --out k --name hub
expect "keys generate refuses to overwrite" 1 'refusing to overwrite' -- "$rlx" keys generate --out k --name hub
expect "the secret key file is private" 0 '^600$' -- stat -c %a k/hub.key
printf 'hub:\n  dataset: missing.jsonl\n' > hub_missing.yaml
expect "hub serve: a missing dataset is named" 2 'dataset: missing.jsonl does not exist' -- "$rlx" hub serve hub_missing.yaml
printf 'hub:\n  credits_per_peer: 0\n' > hub_bad.yaml
expect "hub serve: out-of-range key, path and line" 2 'hub.credits_per_peer \(hub_bad.yaml:2\)' -- "$rlx" hub serve hub_bad.yaml
printf '{"prompt": "a"}\nnot json\n' > bad.jsonl
expect "hub serve: a bad dataset line is named" 1 'bad.jsonl:2: not valid JSON' -- "$rlx" hub serve hub_bad.yaml hub.credits_per_peer=1 hub.dataset=bad.jsonl
expect "hub stats: no hub answers within the timeout" 1 'did not answer' -- "$rlx" hub stats --address ipc://$work/nohub.sock --timeout 0.5
expect "inspect trajectories rejects a non-HDF5 file" 1 'not an HDF5 file' -- "$rlx" inspect trajectories good.yaml
expect "bench bus prints JSON last" 0 '^\{"bench":"bus".*"ingest_vs_raw"' -- \
  bash -c "'$rlx' bench bus --groups 4 --samples 2 --tokens 64 --transports ipc --reps 1 | tail -n 1"
expect "bench bus --processes: hub, worker and learner in processes of their own" 0 \
  '"drain_threads":\{"hub/.*"learner/.*"ingest_threads":\{"hub/.*"worker/.*"raw_threads":\{"pull/.*"push/.*"shape":"processes"' -- \
  bash -c "'$rlx' bench bus --processes --groups 4 --samples 2 --tokens 64 --transports ipc --reps 1 | tail -n 1"
expect "sandbox run: output and an ok verdict" 0 '^42$' -- "$rlx" sandbox run -- python3 -c 'print(6*7)'
expect "sandbox run: the command's exit code" 3 'sandbox: ok exit=3' -- "$rlx" sandbox run -- sh -c 'exit 3'
expect "sandbox run: timeout is exit 124" 124 'sandbox: timeout' -- "$rlx" sandbox run --wall-s 0.5 -- sh -c 'while :; do :; done'
expect "sandbox run: a forbidden call is SIGSYS" 159 'sandbox: filter' -- "$rlx" sandbox run -- unshare -r true
expect "sandbox run: the host is read-only" 2 'Read-only file system' -- "$rlx" sandbox run -- sh -c 'echo x > /etc/rlx-test'
echo "in" > input.txt
expect "sandbox run: --file and --stdin" 0 '^in$' -- "$rlx" sandbox run --file a.txt=input.txt -- cat a.txt
expect "sandbox run --json" 0 '^\{.*"verdict":"ok"' -- "$rlx" sandbox run --json -- true
# --env: what an env server's sandbox gets from its worker (LD_LIBRARY_PATH); nothing else leaks in.
expect "sandbox run --env" 0 '^bar:$' -- env LEAK=1 "$rlx" sandbox run --env FOO=bar -- sh -c 'echo "$FOO:$LEAK"'
expect "sandbox run: a missing program is exit 125" 125 'sandbox: setup_error.*execute the command' -- "$rlx" sandbox run -- /no/such
expect "sandbox run: a bad limit is named" 1 'limits.wall_s = 0 is not in' -- "$rlx" sandbox run --wall-s 0 -- true
expect "sandbox check lists the layers" 0 '"layers":\[.*"seccomp"' -- "$rlx" sandbox check
expect "env list names the bundled environments" 0 'python_code' -- "$rlx" env list
expect "env serve: a missing tokenizer is named" 1 'nope.json' -- "$rlx" env serve --address ipc://$work/env.sock --tokenizer nope.json
expect "bench env prints JSON last" 0 '^\{.*"bench":"env".*"overhead_ms"' -- \
  bash -c "'$rlx' bench env --runs 2 --steps 10 | tail -n 1"
expect "dist run: every rank with its rank and the store" 0 'rank 1 of 3 at 127\.0\.0\.1:[0-9]+' -- \
  "$rlx" dist run --nproc 3 -- bash -c 'echo rank $RLX_RANK of $RLX_WORLD_SIZE at $RLX_STORE'
expect "dist run: a failed rank fails the group, named" 1 'rank 2 exit 7' -- \
  "$rlx" dist run --nproc 3 -- bash -c '[ $RLX_RANK = 2 ] && exit 7; sleep 30'
# Every benchmark runs with its defaults alone (each a few seconds on the tiny preset).
for b in model sampler bus env learner sync; do
  expect "bench $b with its defaults" 0 "^\\{.*\"bench\":\"$b\"" -- bash -c "'$rlx' bench $b | tail -n 1"
done
expect "bench learner: 1 and 2 ranks, JSON last" 0 '^\{.*"bench":"learner".*"mfu".*"ranks":2' -- \
  bash -c "'$rlx' bench learner --preset tiny --seq 32 --batch-seqs 4 --steps 1 | tail -n 1"
expect "inspect checkpoint: not a checkpoint" 1 'no checkpoint' -- "$rlx" inspect checkpoint "$work"
printf 'learner:\n  schedule: cosin\nalgorithm:\n  name: grpo\n' > learner.yaml
expect "config: learner and algorithm sections are checked" 2 "learner.schedule \(learner.yaml:2\).*did you mean 'cosine'" -- \
  "$rlx" config show learner.yaml
expect "config: the algorithm section resolves" 0 'aggregation: token_mean' -- "$rlx" config show good.yaml
# A worker told to stop (SIGTERM) while it waits for its first weights stops there, at once.
# One restarted as its run ended (the learner and its segment gone) waited 120 s for them.
mkdir -p worker_run
expect "role worker: SIGTERM before its first weights stops it, exit 0" 0 \
  'worker-0: stopped \(SIGTERM\) before its first weights .*gave up waiting for a publisher' -- bash -c "
  '$rlx' role worker --config '$src/tests/e2e/grpo.yaml' --run-dir '$PWD/worker_run' --weights rlx-cli-none-\$\$ \\
    --exe '$rlx' --index 0 2>&1 & pid=\$!
  for _ in \$(seq 1 300); do [ -f '$PWD/worker_run/heartbeats/worker-0' ] && break; sleep 0.1; done
  sleep 0.5; kill -TERM \$pid  # its heartbeat starts just before its handler goes in
  for _ in \$(seq 1 100); do kill -0 \$pid 2>/dev/null || break; sleep 0.1; done
  kill -0 \$pid 2>/dev/null && { echo 'still running 10 s after SIGTERM'; kill -KILL \$pid; }
  wait \$pid"
echo "$((checks - failures)) passed, $failures failed"
[ "$failures" = 0 ]
