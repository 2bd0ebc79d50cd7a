#!/usr/bin/env bash
# How long a 2-rank learner group's run stalls when one learner rank is SIGKILLed: rank 1
# (restarted alone; the group re-forms around it, rank 0 trains the steps since the newest
# checkpoint again) against rank 0 (the whole run restarts from that checkpoint: hub,
# workers, learner). The e2e suite's synchronous GRPO config on the tiny model, 40 steps,
# a checkpoint every 4; the kill comes once step 10 is reported (the newest checkpoint is
# step 8). Stall: from the kill to the report of step 14, minus the time steps 11-14 take
# in a run nothing interrupted (the same run's steps 5-8 before the kill).
#   scripts/bench_reform.sh RLX_BINARY [REPEATS]      last line: JSON
set -euo pipefail
rlx=$(realpath "$1") repeats=${2:-3} here=$(cd "$(dirname "$0")/.." && pwd)
work=$(mktemp -d /tmp/rlx-bench-reform.XXXXXX)
trap 'pkill -KILL -f -- "$work/runs" 2>/dev/null || true; rm -rf "$work"' EXIT
cd "$work"
cp "$here/tests/e2e/grpo.yaml" grpo.yaml
python3 - "$rlx" "$repeats" <<'P'
import json, os, signal, statistics, subprocess, sys, time
rlx, repeats = sys.argv[1], int(sys.argv[2])

def steps_seen(path, seen):  # step -> first time seen, reading the file's new lines
    try:
        with open(path) as f:
            for line in f:
                s = json.loads(line)["step"]
                seen.setdefault(s, time.time())
    except (OSError, ValueError):
        pass

def learner_pids(name):
    out = subprocess.run(["pgrep", "-f", f"role learner.*{os.getcwd()}/runs/{name}"], capture_output=True, text=True)
    return sorted(int(p) for p in out.stdout.split())

def one(name, victim_rank):
    run = subprocess.Popen([rlx, "run", "grpo.yaml", f"run.name={name}", "train.learner_ranks=2", "train.steps=40",
                            "learner.checkpoint_every=4"], stdout=open(name + ".log", "w"), stderr=subprocess.STDOUT)
    seen, killed = {}, None
    deadline = time.time() + 300
    while 14 not in seen or killed is None:
        assert time.time() < deadline and run.poll() is None, f"{name}: the run ended or stalled: see {name}.log"
        steps_seen(f"runs/{name}/metrics.jsonl", seen)
        if killed is None and 10 in seen:
            assert 11 not in seen, f"{name}: step 11 came before the kill; steps are too fast to measure"
            os.kill(learner_pids(name)[victim_rank], signal.SIGKILL)  # rank 0 started first
            killed = time.time()
            seen = {s: t for s, t in seen.items() if s <= 10}
        time.sleep(0.002)
    assert run.wait(timeout=300) == 0, f"{name}: the run failed: see {name}.log"
    return max(0.0, (seen[14] - killed) - (seen[8] - seen[4]))

r1, r0 = [], []
for i in range(repeats):
    r1.append(one(f"r1-{i}", 1))
    r0.append(one(f"r0-{i}", 0))
    print(f"repeat {i + 1}: rank 1 killed (group re-formed) {r1[-1]:.2f} s, rank 0 killed (run restarted) {r0[-1]:.2f} s",
          file=sys.stderr)
m1, m0 = statistics.median(r1), statistics.median(r0)
print(json.dumps({"bench": "reform", "stall_s_rank1_reformed": round(m1, 3), "stall_s_rank0_run_restart": round(m0, 3),
                  "repeats": repeats, "restart_over_reform": round(m0 / max(m1, 1e-3), 2)}))
P
