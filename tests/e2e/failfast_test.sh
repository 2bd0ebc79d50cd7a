#!/usr/bin/env bash
# `rlx run` from ordinary places, and runs that cannot work: real processes, real signals.
#  1. A run directory under a 0700 parent (as `mktemp -d` makes, as root's home is) trains
#     end to end with sandboxed env servers.
#  2. A run that cannot work stops within ERROR_BOUND_S with the cause on stderr: an env
#     server that cannot start (caught before any role starts, and, with run.preflight=false,
#     reported by its worker), a sandbox without the binary's paths, a role that fails at
#     start with the same error every time.
#  3. SIGINT stops the run within STOP_BOUND_S in each state: waiting for the first weights,
#     inside an env call's retries, during a checkpoint, with a worker SIGSTOPped; the
#     learner's checkpoint is complete.
#  4. A second launcher on a live run directory is refused, naming the first one's PID.
# It prints each measured time ("time: CASE S"), for docs/PERF.md and the closing note.
#   failfast_test.sh RLX_BINARY WORK_DIR
set -uo pipefail
rlx=$1 work=$2 here=$(cd "$(dirname "$0")" && pwd)
rm -rf "$work" && mkdir -p "$work" && cd "$work"
failures=0
fail() { failures=$((failures + 1)); echo "FAIL: $*"; }
ok() { echo "ok: $*"; }
ERROR_BOUND_S=20  # a run that cannot work: start to exit (measured: under 3 s on cpu2)
STOP_BOUND_S=15   # SIGINT to exit (measured: under 5 s on cpu2, the injected 4 s checkpoint included)
cp "$here/grpo.yaml" grpo.yaml
now() { date +%s.%N; }
since() { python3 -c "import sys; print(f'{float(sys.argv[2]) - float(sys.argv[1]):.1f}')" "$1" "$(now)"; }
within() { python3 -c "import sys; sys.exit(0 if float(sys.argv[1]) <= float(sys.argv[2]) else 1)" "$1" "$2"; }
# status RUN ROLE-INDEX: what the role's heartbeat says it is doing
status() { python3 -c "import json, sys; print(json.load(open(sys.argv[1]))['status'])" "runs/$1/heartbeats/$2" 2>/dev/null; }
wait_status() {  # wait_status RUN ROLE-INDEX REGEX: until the role says so (60 s at most)
  for _ in $(seq 1 600); do status "$1" "$2" | grep -Eq "$3" && return 0; sleep 0.1; done
  return 1
}
wait_steps() {  # wait_steps RUN N: until N metrics lines (120 s at most)
  for _ in $(seq 1 1200); do [ "$(cat "runs/$1/metrics.jsonl" 2>/dev/null | wc -l)" -ge "$2" ] && return 0; sleep 0.1; done
  return 1
}

# --- 1. a run directory under a 0700 parent ---
# The binary there too: every path the sandbox binds (the binary's directory, the socket
# directory) lies below the 0700 directory. In /tmp, so that the sockets stay in the run
# directory (a deeper one puts them in /tmp/rlx-NAME-HASH).
private=$(mktemp -d)
trap 'rm -rf "$private" /tmp/rlx-memory_running-*' EXIT  # (the socket directory of a deep run directory)
[ "$(stat -c %a "$private")" = 700 ] || fail "mktemp -d did not make a 0700 directory"
mkdir "$private/bin" && cp "$rlx" "$private/bin/rlx"
t0=$(now)
timeout -k 10 300 "$private/bin/rlx" run grpo.yaml run.out_dir="$private/runs" run.name=private env.servers=1 rollout.workers=1 train.steps=3 \
  > private.log 2>&1; rc=$?
echo "time: 0700 parent, 3 steps with a sandboxed env server $(since "$t0") s"
[ $rc = 0 ] && [ -f "$private/runs/private/final/model.safetensors" ] \
  && grep -q "env server: serving .*ipc://$private/runs/private/env-sockets/" "$private"/runs/private/logs/worker-0/rank-0.err \
  && ok "a run directory under a 0700 parent trains end to end (sandboxed env server)" \
  || fail "0700 parent: rc $rc: $(tail -3 private.log; grep -h "sandbox" "$private"/runs/private/logs/worker-0*/rank-0.err | tail -2)"

# --- 2. runs that cannot work ---
cannot() {  # cannot NAME EXPECT_REGEX... -- OVERRIDES: exits non-zero within ERROR_BOUND_S, stderr matching each regex
  local name=$1 patterns=() t0 rc took
  shift
  while [ "$1" != -- ]; do patterns+=("$1"); shift; done
  shift
  t0=$(now)
  timeout -k 10 $((ERROR_BOUND_S + 30)) "$rlx" run grpo.yaml run.name="$name" train.steps=200 "$@" > "$name.log" 2>&1; rc=$?
  took=$(since "$t0")
  echo "time: $name: start to exit $took s (rc $rc)"
  local missing=""
  for p in "${patterns[@]}"; do grep -Eq "$p" "$name.log" || missing="$missing '$p'"; done
  [ $rc != 0 ] && [ $rc != 124 ] && within "$took" $ERROR_BOUND_S && [ -z "$missing" ] && [ -z "$(pgrep -f -- "$PWD/runs/$name/|rlx-$name-")" ] \
    && ok "$name: exit $rc within $ERROR_BOUND_S s, the cause on stderr" \
    || fail "$name: rc $rc after $took s, missing$missing: $(tail -4 "$name.log")"
}
# The env server's memory limit (on top of what its libraries map) is too small for it to start:
# caught before any role starts (the loader or the allocator fails first).
cannot memory "cannot start: the env server does not start" "failed to map segment|std::bad_alloc" "memory_mb 16 \(\+ [0-9]+ MiB its libraries map\)" \
  -- env.servers=1 env.sandbox.limits.memory_mb=16
[ ! -d runs/memory/logs/hub-0 ] && ok "memory: no role was started" || fail "memory: roles were started"
# The same with the checks off: the worker's env server fails twice at start; the worker
# reports it, and the launcher stops the run instead of restarting anything.
cannot memory_running "worker [01] cannot run: env server .* cannot start" "failed to map segment|std::bad_alloc" "memory_mb 16 \(\+ [0-9]+" \
  "stopping the run" -- env.servers=1 env.sandbox.limits.memory_mb=16 run.preflight=false
grep -q "restarting" memory_running.log && fail "memory_running: something was restarted" || ok "memory_running: nothing restarted"
# A sandbox that lacks the binary's system paths: the sandbox's own message, naming the command.
cannot nopaths "sandbox set-up failed at 'execute the command' /.*rlx: No such file" \
  -- env.servers=1 'env.sandbox.readonly_paths=[/etc]'
# A role that fails at start with the same error every time (a model directory whose
# config.json is not JSON; the checks off): no restart after the second.
cp -r "$private/runs/private/final" badmodel && echo "{not json" > badmodel/config.json
cannot badmodel "failed at start twice with the same error" "badmodel/config.json" -- model.path="$PWD/badmodel" run.preflight=false
cannot badmodel_checked "cannot start: model or tokenizer: .*badmodel/config.json" -- model.path="$PWD/badmodel"

# --- 3. SIGINT in each state ---
stop_in() {  # stop_in NAME: SIGINT to the launcher $pid; it must exit 130 within STOP_BOUND_S
  local t0 rc took
  t0=$(now)
  kill -INT "$pid"
  for _ in $(seq 1 $(((STOP_BOUND_S + 30) * 10))); do kill -0 "$pid" 2>/dev/null || break; sleep 0.1; done
  kill -KILL "$pid" 2>/dev/null  # past the bound: the test fails, without waiting for the launcher's own limits
  wait "$pid"; rc=$?
  took=$(since "$t0")
  echo "time: SIGINT $1: $took s (rc $rc)"
  pkill -CONT -f -- "runs/$1/|rlx-$1-" 2>/dev/null
  sleep 0.2
  local left
  left=$(pgrep -af -- "$PWD/runs/$1/|rlx-$1-")
  [ $rc = 130 ] && within "$took" $STOP_BOUND_S && [ -z "$left" ] && grep -q -- "--resume" "$1.log" \
    && ok "$1: SIGINT stopped the run in $took s (bound $STOP_BOUND_S s), exit 130" \
    || fail "$1: SIGINT: rc $rc after $took s; left: $left; $(tail -3 "$1.log")"
  pkill -KILL -f -- "runs/$1/|rlx-$1-" 2>/dev/null
}
# Waiting for the first weights: the learner is still starting (held 60 s here).
RLX_FAULT=slow-start:learner:60 "$rlx" run grpo.yaml run.name=firstweights train.steps=200 > firstweights.log 2>&1 &
pid=$!
wait_status firstweights worker-0 "first weights" || fail "firstweights: worker 0 never waited for the first weights"
stop_in firstweights
# Inside an env call's retries: the env server is stopped (SIGSTOP), the worker retries.
# The launcher names what each role waits on meanwhile (train.report_every_s).
"$rlx" run grpo.yaml run.name=envretry env.servers=1 rollout.workers=1 env.timeout_s=1 env.retries=100 train.steps=200 \
  train.report_every_s=2 > envretry.log 2>&1 &
pid=$!
wait_steps envretry 2 || fail "envretry: no progress"
pkill -STOP -f -- "env serve --address ipc://[^ ]*envretry" || fail "envretry: no env server to stop"
wait_status envretry worker-0 "env call .*try [2-9]" || fail "envretry: worker 0 is not retrying: $(status envretry worker-0)"
# (".*try" alone would match the run directory's name, envretry.)
retrying="no step for [0-9]+ s .*worker 0: env call '(reset|step)'.*try [0-9]+ of 101"
for _ in $(seq 1 100); do grep -Eq "$retrying" envretry.log && break; sleep 0.1; done
grep -Eq "$retrying" envretry.log \
  && grep -Eq "no step for .*learner 0: waiting for a batch" envretry.log \
  && ok "envretry: the console says what the learner and the worker wait on" \
  || fail "envretry: no report of what the roles wait on: $(grep "no step" envretry.log | tail -1)"
stop_in envretry
# `rlx scale` to 0 while the worker retries a stopped env server: it leaves within the bound
# (its leases go back to the hub); scaled to 1 again, the run goes on.
"$rlx" run grpo.yaml run.name=scale0 env.servers=1 rollout.workers=1 env.timeout_s=1 env.retries=100 train.steps=200 \
  train.report_every_s=2 > scale0.log 2>&1 &
pid=$!
wait_steps scale0 2 || fail "scale0: no progress"
pkill -STOP -f -- "env serve --address ipc://[^ ]*scale0" || fail "scale0: no env server to stop"
wait_status scale0 worker-0 "env call .*try [2-9]" || fail "scale0: worker 0 is not retrying: $(status scale0 worker-0)"
t0=$(now)
"$rlx" scale runs/scale0 --workers 0 2>>scale0.err || fail "scale0: rlx scale 0: $(cat scale0.err)"
for _ in $(seq 1 $((STOP_BOUND_S * 10 + 100))); do grep -q "worker 0 left" scale0.log && break; sleep 0.1; done
took=$(since "$t0")
echo "time: rlx scale to 0 with the worker in env retries: left after $took s"
grep -q "worker 0 left" scale0.log && within "$took" $STOP_BOUND_S \
  && ok "scale0: scaled to 0, the retrying worker left in $took s" || fail "scale0: the worker did not leave: $(tail -3 scale0.log)"
for _ in $(seq 1 100); do grep -q "no rollout worker" scale0.log && break; sleep 0.1; done
grep -q "no rollout worker (rlx scale to 0" scale0.log && ok "scale0: the console says rollout is paused" \
  || fail "scale0: no report of the pause: $(tail -2 scale0.log)"
steps=$(wc -l < runs/scale0/metrics.jsonl)
"$rlx" scale runs/scale0 --workers 1 2>>scale0.err && wait_steps scale0 $((steps + 2)) \
  && ok "scale0: scaled to 1 again, training goes on" || fail "scale0: no progress after scaling up: $(tail -3 scale0.log)"
stop_in scale0
# During a checkpoint (the first one held 4 s): it completes, then the run stops.
RLX_FAULT=slow-checkpoint:4 "$rlx" run grpo.yaml run.name=ckpt learner.checkpoint_every=2 train.steps=200 > ckpt.log 2>&1 &
pid=$!
wait_status ckpt learner-0 "checkpointing" || fail "ckpt: the learner never checkpointed"
stop_in ckpt
"$rlx" inspect checkpoint runs/ckpt/checkpoints > ckpt.inspect 2>&1 && grep -q "step_00000002" ckpt.inspect \
  && ok "ckpt: the checkpoint written during the stop verifies" || fail "ckpt: $(tail -3 ckpt.inspect)"
# With a worker SIGSTOPped.
"$rlx" run grpo.yaml run.name=stopped train.steps=200 > stopped.log 2>&1 &
pid=$!
wait_steps stopped 2 || fail "stopped: no progress"
victim=$(pgrep -f -- "role worker.*$PWD/runs/stopped/" | head -1)
[ -n "$victim" ] && kill -STOP "$victim" || fail "stopped: no worker to stop"
stop_in stopped
# What the checkpoint holds resumes: the stopped run continues to its end.
"$rlx" run grpo.yaml run.name=stopped train.steps=30 --resume > stopped2.log 2>&1 \
  && grep -q "resuming" stopped2.log && [ -f runs/stopped/final/model.safetensors ] \
  && ok "stopped: --resume continues the stopped run to its end" || fail "stopped: resume: $(tail -3 stopped2.log)"

# --- 4. a second launcher on a live run directory (issue 50, item 3) ---
# It used to start from step 0 in the same directory and kill the first run. Now it is
# refused at once, naming the first launcher's PID; the first run goes on to its end.
# (300 steps, about 20 s: long enough for the two refusals below, each under a second.)
"$rlx" run grpo.yaml run.name=dual train.steps=300 train.generated_tasks=2000 > dual.log 2>&1 &
first=$!
wait_steps dual 1 || fail "dual: no progress"
t0=$(now)
"$rlx" run grpo.yaml run.name=dual train.steps=300 train.generated_tasks=2000 --resume > dual2.log 2>&1; rc=$?
[ $rc != 0 ] && grep -q "is in use by another launcher (pid $first)" dual2.log && within "$(since "$t0")" 5 \
  && ok "dual: a second launcher is refused within $(since "$t0") s, naming pid $first" || fail "dual: rc $rc: $(tail -3 dual2.log)"
"$rlx" run grpo.yaml run.name=dual train.steps=300 train.generated_tasks=2000 --force > dual3.log 2>&1; rc=$?
[ $rc != 0 ] && grep -q "in use by another launcher" dual3.log && ok "dual: --force is refused too" || fail "dual --force: rc $rc"
wait $first; rc=$?
[ $rc = 0 ] && [ "$(wc -l < runs/dual/metrics.jsonl)" = 300 ] && [ -f runs/dual/final/model.safetensors ] \
  && ok "dual: the first run trained its 300 steps untouched" || fail "dual: first run rc $rc: $(tail -3 dual.log)"
# Its end lets go of the lock: --resume of the finished run is allowed again.
"$rlx" run grpo.yaml run.name=dual train.steps=300 train.generated_tasks=2000 --resume > dual4.log 2>&1 \
  && ok "dual: after the first launcher ends, --resume is allowed" || fail "dual: resume after the end: $(tail -3 dual4.log)"
# A stale socket is not left behind by a run stopped with SIGTERM (issue 50, item 12).
[ ! -e runs/dual/hub.sock ] && ok "dual: no hub.sock left after the run" || fail "dual: runs/dual/hub.sock left behind"

echo "$failures failures"
[ "$failures" = 0 ]
