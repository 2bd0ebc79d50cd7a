#!/usr/bin/env bash
# GRPO whose episodes are agent programs: examples/agents/calculator_agent.js on the OpenAI
# Node SDK, each in the sandbox, calling the policy through its gateway (env agent_program),
# a tiny model with Qwen3's tokenizer and chat template. Checks: the trajectories are the
# sampled turns (actions with log-probs and versions, observations without), the learner's
# log-probs of them match the sampler's, every lease once; a worker killed after an episode
# checkpoint: its successor replays the programs to where they were and the run ends with the
# same parameters as the fault-free one.
#   agent_test.sh RLX_BINARY SOURCE_DIR WORK_DIR CHAT_FIXTURE_DIR
set -uo pipefail
rlx=$1 src=$2 work=$3 fixtures=$4
rm -rf "$work" && mkdir -p "$work" && cd "$work"
failures=0
fail() { failures=$((failures + 1)); echo "FAIL: $*"; }
ok() { echo "ok: $*"; }
[ -f "$fixtures/.complete" ] || { echo "missing $fixtures: run scripts/make_chat_template_fixtures.sh $fixtures"; exit 1; }

"$rlx" model init --preset tiny --tokenizer "$fixtures/qwen3/tokenizer.json" --out model --seed 1 >/dev/null
cp "$fixtures/qwen3/tokenizer_config.json" model/
python3 - <<'P'
import json, random
r = random.Random(1)
with open("tasks.jsonl", "w") as f:
    for _ in range(64):
        a, b, c = r.randint(2, 40), r.randint(2, 40), r.randint(1, 99)
        f.write(json.dumps({"prompt": f"What is {a} * {b} + {c}?", "answer": a * b + c, "max_calls": 3}) + "\n")
P
cat > agent.yaml <<Y
run: {name: agentref, out_dir: runs, seed: 1, threads: 1, plots: false}
model: {path: model}
hub: {group_size: 2, dataset: tasks.jsonl}
env:
  name: agent_program
  servers: 1
  max_turns: 3
  options:
    command: '["node", "$src/examples/agents/calculator_agent.js"]'
    chat_template_dir: model
    readonly_paths: '["$src/examples/agents", "$fixtures/node_modules"]'
    env: '["NODE_PATH=$fixtures/node_modules"]'
    call_timeout_s: 30
  sandbox: {limits: {wall_s: 120, cpu_s: 60, memory_mb: 16384, processes: 1024, open_files: 256}}
learner: {lr: 1e-4, checkpoint_every: 0}
algorithm: {name: grpo}
rollout: {workers: 1, max_new_tokens: 12, episode_checkpoint_turns: 1}
train: {mode: sync, steps: 4, groups_per_step: 2}
Y

"$rlx" run agent.yaml > agentref.log 2>&1 || { fail "agent run: $(tail -5 agentref.log; tail -20 runs/agentref/logs/*/rank-0.err)"; exit 1; }
ok "a GRPO run whose episodes are sandboxed SDK agents completed"
"$rlx" inspect trajectories runs/agentref/trajectories.h5 --dump 100 | grep '^{"' > dump.jsonl
python3 - dump.jsonl runs/agentref/metrics.jsonl <<'P' && ok "trajectories: the calls' turns, versions and log-probs on actions only; learner log-probs match" \
  || fail "agent trajectories"
import json, sys
turns, n = [], 0
for line in open(sys.argv[1]):
    for t in json.loads(line)["samples"]:
        m, v, lp = t["loss_mask"], t["versions"], t["logprobs"]
        assert len(m) == len(v) == len(t["tokens"]) == len(lp)
        assert all((x >= 0) == (k == 1) for x, k in zip(v, m)), "a version outside an action, or none inside one"
        assert all((k == 1) == (p != 0.0) or k == 1 for p, k in zip(lp, m))
        turns.append(sum(1 for i in range(1, len(m)) if m[i] == 1 and m[i - 1] == 0))
        n += 1
assert n >= 4 * 2 * 2, n
assert max(turns) >= 2, turns  # the agent asked again: observations between actions
m = [json.loads(l) for l in open(sys.argv[2])]
assert len(m) == 4
assert all(x["mismatch_kl"] < 1e-3 for x in m), [x["mismatch_kl"] for x in m]
P
"$rlx" inspect trajectories runs/agentref/trajectories.h5 | python3 -c '
import json, sys
s = json.load(sys.stdin)
assert s["groups"] == s["distinct_leases"] == s["distinct_prompts"] >= 8, s' && ok "agentref: each lease once" || fail "agentref: duplicates"
# The first trajectory decodes to the agent's conversation in Qwen3's format.
python3 - dump.jsonl > ids.txt <<'P'
import json
t = json.loads(open("dump.jsonl").readline())["samples"][0]
print(" ".join(map(str, t["tokens"][:t["prompt_len"]])))
P
text=$("$rlx" tokenize --tokenizer model/tokenizer.json --decode "$(cat ids.txt)")
grep -q "<|im_start|>system" <<<"$text" && grep -q '"name": "calculator"' <<<"$text" && grep -q "<|im_start|>assistant" <<<"$text" \
  && ok "the prompt is the agent's first call through the chat template (system, tools, user)" || fail "prompt text: $text"

# A worker killed right after an episode checkpoint: its successor starts the programs again
# and answers their calls from the record; the run ends as the fault-free one did.
RLX_FAULT=kill-after-episode-checkpoint:0:2 "$rlx" run agent.yaml run.name=agentkill > agentkill.log 2>&1; rc=$?
[ $rc = 0 ] && grep -q "worker 0 ended: killed by signal 9" agentkill.log && [ -f runs/agentkill/fault-injected ] \
  && grep -q "continues its episodes at turn [1-2]" runs/agentkill/logs/worker-0.*/rank-0.err \
  && ok "agentkill: a worker killed after an episode checkpoint; its successor continued the agents' episodes mid-way" \
  || fail "agentkill: rc $rc: $(tail -3 agentkill.log; tail -5 runs/agentkill/logs/worker-0*/rank-0.err)"
cmp -s runs/agentref/final/model.safetensors runs/agentkill/final/model.safetensors \
  && ok "agentkill: final parameters equal the fault-free run's" || fail "agentkill: final parameters differ"
"$rlx" inspect trajectories runs/agentkill/trajectories.h5 | python3 -c '
import json, sys
s = json.load(sys.stdin)
assert s["groups"] == s["distinct_leases"] == s["distinct_prompts"] >= 8, s' && ok "agentkill: each lease once" || fail "agentkill: duplicates"

[ $failures = 0 ] && echo "agent test: passed" || { echo "agent test: $failures failures"; exit 1; }
