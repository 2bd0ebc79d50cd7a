#!/usr/bin/env bash
# The bus with real processes: a hub, synthetic workers and a learner (rlx bus ...).
#   1. A worker killed with SIGKILL mid-stream: its leases are re-issued; the learner
#      trains every prompt exactly once (no duplicate, no hole), and the HDF5 store agrees.
#   2. The learner stopped with SIGSTOP: workers block at their credits, the hub's buffer
#      stays within its capacity; after SIGCONT nothing is lost or repeated.
#   3. The hub's trajectory file cannot grow (ulimit -f, as a full disk): the hub lives,
#      says why, keeps at most hub.store_max_pending_mb, then takes no more groups; once the
#      limit is lifted (prlimit) everything is written and trained exactly once.
#   4. `rlx inspect trajectories` reads the file while the hub writes it (HDF5 SWMR): every
#      read is a whole prefix of what is written, content checked; after the hub is killed
#      with SIGKILL the file still reads, a second writer is refused while one lives, and a
#      restarted hub opens the file again and keeps its groups.
#   bus_processes.sh RLX_BINARY WORK_DIR
set -euo pipefail
rlx=$1 work=$2
rm -rf "$work" && mkdir -p "$work" && cd "$work"
pids=()
cleanup() { for p in "${pids[@]}"; do kill -9 "$p" 2>/dev/null || true; done; }
trap cleanup EXIT
fail() { echo "FAIL: $*"; for f in *.err; do echo "--- $f"; tail -5 "$f"; done; exit 1; }

n=60
for i in $(seq 0 $((n - 1))); do echo "{\"prompt\":\"q$i\"}"; done > data.jsonl

start_hub() {  # name capacity [extra hub: lines]
  cat > "$1.yaml" <<YAML
hub:
  address: ipc://$work/$1.sock
  dataset: $work/data.jsonl
  group_size: 4
  heartbeat_s: 0.2
  peer_timeout_s: 1.5
  lease_timeout_s: 30
  credits_per_peer: 2
  trajectory_file: $work/$1.h5
  state_file: $work/$1.state
  replay:
    capacity_groups: $2
${3:-}
YAML
  (
    if [ -n "${HUB_ULIMIT:-}" ]; then ulimit -S -f "$HUB_ULIMIT"; fi  # in 1 KiB blocks
    exec "$rlx" hub serve "$1.yaml" > "$1.out" 2> "$1.err"
  ) &
  pids+=($!)
  hub_pid=$!
}

check_consumed() {  # file hub_h5 expected
  python3 - "$1" "$2" "$3" <<'PY' || fail "consumed set of $1"
import json, subprocess, sys
path, h5, n = sys.argv[1], sys.argv[2], int(sys.argv[3])
rows = [json.loads(l) for l in open(path)]
prompts = sorted(r["prompt_index"] for r in rows)
leases = [r["lease_id"] for r in rows]
assert prompts == list(range(n)), f"prompts trained: {len(prompts)}, distinct {len(set(prompts))}, want 0..{n-1}"
assert len(set(leases)) == len(leases), "a lease was trained twice"
print(f"ok: {n} prompts trained exactly once")
PY
}

stat() { "$rlx" hub stats --address "ipc://$work/$1.sock" | python3 -c "import json,sys; print(int(json.load(sys.stdin)['$2']))"; }

# --- 1. SIGKILL a producer mid-stream ------------------------------------------------------
start_hub kill 64
"$rlx" bus worker --address "ipc://$work/kill.sock" --name victim --leases 4 --delay-ms 30 --timeout 30 > victim.out 2> victim.err &
victim=$!; pids+=($victim)
"$rlx" bus learner --address "ipc://$work/kill.sock" --name learner --out kill.consumed --timeout 60 > kill-learner.out 2> kill-learner.err &
learner=$!; pids+=($learner)
for _ in $(seq 100); do [ -s kill.consumed ] && break; sleep 0.05; done
sleep 0.2
kill -9 $victim
echo "killed the worker after $(wc -l < kill.consumed) groups were trained"
"$rlx" bus worker --address "ipc://$work/kill.sock" --name survivor --leases 4 --timeout 30 > survivor.out 2> survivor.err \
  || fail "the surviving worker failed"
wait $learner || fail "the learner failed"
check_consumed kill.consumed kill.h5 $n
[ "$(stat kill lease_errors)" = 0 ] || fail "leases ended in errors"
[ "$(stat kill leases_completed)" = $n ] || fail "leases completed != $n"
[ "$(stat kill peers_lost)" -ge 1 ] || fail "the hub never noticed the killed worker"
"$rlx" hub stop --address "ipc://$work/kill.sock"
wait $hub_pid || fail "hub exit status"
"$rlx" inspect trajectories kill.h5 | python3 -c "
import json,sys; s=json.load(sys.stdin); assert s['groups']==$n and s['distinct_leases']==$n and s['distinct_prompts']==$n, s" \
  || fail "the HDF5 store disagrees"

# --- 2. SIGSTOP the consumer ------------------------------------------------------------------
start_hub stop 6
"$rlx" bus learner --address "ipc://$work/stop.sock" --name learner --out stop.consumed --delay-ms 20 --timeout 60 > stop-learner.out 2> stop-learner.err &
learner=$!; pids+=($learner)
"$rlx" bus worker --address "ipc://$work/stop.sock" --name w0 --timeout 60 > w0.out 2> w0.err &
w0=$!; pids+=($w0)
"$rlx" bus worker --address "ipc://$work/stop.sock" --name w1 --timeout 60 > w1.out 2> w1.err &
w1=$!; pids+=($w1)
for _ in $(seq 100); do [ -s stop.consumed ] && break; sleep 0.05; done
kill -STOP $learner
sleep 3  # longer than peer_timeout_s: the hub also declares the learner lost
buffered=$(stat stop buffer_groups)
accepted_then=$(stat stop accepted_total)
sleep 1
accepted_later=$(stat stop accepted_total)
echo "learner stopped: buffer $buffered/6 groups, accepted $accepted_then then $accepted_later"
[ "$buffered" -le 6 ] || fail "the buffer grew past its capacity"
[ "$accepted_then" = "$accepted_later" ] || fail "the hub kept accepting with a full buffer"
kill -0 $w0 && kill -0 $w1 || fail "a worker exited instead of waiting for credit"
kill -CONT $learner
wait $w0 || fail "worker w0 failed"
wait $w1 || fail "worker w1 failed"
wait $learner || fail "the learner failed after SIGCONT"
check_consumed stop.consumed stop.h5 $n
grep -q '"credit_waits":[1-9]' w0.out w1.out || fail "no worker ever waited for credit"
"$rlx" hub stop --address "ipc://$work/stop.sock"
wait $hub_pid || fail "hub exit status"

# --- 3. The trajectory file cannot grow -------------------------------------------------------
HUB_ULIMIT=1024 start_hub full 64 "  store_max_pending_mb: 16"  # 1 MiB: the empty file fits, no stage does
"$rlx" bus learner --address "ipc://$work/full.sock" --name learner --out full.consumed --timeout 60 > full-learner.out 2> full-learner.err &
learner=$!; pids+=($learner)
"$rlx" bus worker --address "ipc://$work/full.sock" --name w0 --tokens 20000 --timeout 60 > full-w0.out 2> full-w0.err &
w0=$!; pids+=($w0)
for _ in $(seq 100); do
  kill -0 $hub_pid 2>/dev/null || fail "the hub died: $(tail -3 full.err)"
  [ "$(stat full groups_store_full 2>/dev/null || echo 0)" -ge 1 ] && break
  sleep 0.1
done
sleep 1
accepted_then=$(stat full accepted_total)
sleep 1
[ "$(stat full accepted_total)" = "$accepted_then" ] || fail "the hub kept accepting groups it could not store"
pending=$(stat full store_pending_mb)
echo "file cannot grow: $accepted_then groups accepted, $pending MiB waiting, $(stat full store_write_failures) failed writes"
[ "$pending" -ge 16 ] && [ "$pending" -le 17 ] || fail "store_pending_mb $pending, want 16 (the bound)"
grep -q "File too large" full.err || fail "the hub's log does not say why it cannot write"
prlimit --pid $hub_pid --fsize=unlimited
wait $w0 || fail "the worker failed after the limit was lifted"
wait $learner || fail "the learner failed after the limit was lifted"
check_consumed full.consumed full.h5 $n
grep -q "written again" full.err || fail "the hub never said the file was written again"
"$rlx" hub stop --address "ipc://$work/full.sock"
wait $hub_pid || fail "hub exit status"
"$rlx" inspect trajectories full.h5 | python3 -c "
import json,sys; s=json.load(sys.stdin); assert s['groups']==$n and s['distinct_leases']==$n, s" \
  || fail "the HDF5 store disagrees"
# --- 4. Readers while the hub writes; the hub killed ---------------------------------------------
cat > check_dump.py <<'PY'
# The groups `rlx inspect trajectories --dump` printed, each checked against what
# `rlx bus worker` generates (cmd_bus.cpp's synthetic_group); prints how many.
import json, sys
n = 0
for line in sys.stdin:
    if not line.startswith('{"'): continue
    g, n = json.loads(line), n + 1
    p = g["prompt_index"]
    assert g["worker"] == "w0", g["worker"]
    assert len(g["samples"]) == 4, len(g["samples"])
    for s, t in enumerate(g["samples"]):
        assert t["finish"] == "stop" and json.loads(t["metadata"]) == {"prompt_index": p}, (t["finish"], t["metadata"])
        assert len(t["tokens"]) == len(t["logprobs"]) == len(t["loss_mask"]) == 4000
        assert all(x == (p * 31 + s * 7 + i) % 50000 for i, x in enumerate(t["tokens"])), f"tokens of prompt {p} sample {s}"
print(n)
PY
start_hub live 64 "  save_every_s: 0.3"
for _ in $(seq 100); do grep -q "serving" live.err && break; sleep 0.05; done  # its file made, open to readers
"$rlx" bus learner --address "ipc://$work/live.sock" --name learner --out live.consumed --timeout 60 > live-learner.out 2> live-learner.err &
learner=$!; pids+=($learner)
# 4 x 4000 tokens: 36 KB a group, so the hub writes its 8 MiB stage only on its 5 s clock
"$rlx" bus worker --address "ipc://$work/live.sock" --name w0 --tokens 4000 --leases 1 --delay-ms 100 --timeout 60 > live-w0.out 2> live-w0.err &
w0=$!; pids+=($w0)
seen=() last=0
for _ in $(seq 60); do
  got=$("$rlx" inspect trajectories live.h5 --dump 1000 2> live-read.err | python3 check_dump.py) \
    || fail "a read of the file while the hub writes it: $(tail -2 live-read.err)"
  [ "$got" -ge "$last" ] || fail "a later read saw fewer groups ($got < $last)"
  last=$got
  [ "$got" -gt 0 ] && seen+=("$got")
  [ "${#seen[@]}" -ge 2 ] && [ "$got" -gt "${seen[0]}" ] && break
  sleep 0.5
done
echo "read while written: ${seen[*]} groups"
[ "${#seen[@]}" -ge 2 ] && [ "$last" -gt "${seen[0]}" ] || fail "the readers never saw the file grow"
"$rlx" hub serve live.yaml hub.address=ipc://$work/live2.sock > live2.out 2> live2.err \
  && fail "a second hub wrote the same trajectory file"
grep -q "being written by another process" live2.err || fail "the second writer was not told why: $(tail -1 live2.err)"
sleep 0.5  # a state save past the last read
kill -9 $hub_pid
kill -9 $w0 $learner 2>/dev/null || true  # the peers too (if still there): the restarted hub is to take no new groups
wait $hub_pid $w0 $learner 2>/dev/null || true
killed=$("$rlx" inspect trajectories live.h5 --dump 1000 | python3 check_dump.py) || fail "the killed hub's file does not read"
start_hub live 64 "  save_every_s: 0.3"
for _ in $(seq 50); do grep -q "restored" live.err && break; sleep 0.1; done
grep -q "restored" live.err || fail "the restarted hub did not restore: $(tail -2 live.err)"
"$rlx" hub stop --address "ipc://$work/live.sock"
wait $hub_pid || fail "the restarted hub's exit status: $(tail -2 live.err)"
kept=$("$rlx" inspect trajectories live.h5 --dump 1000 | python3 check_dump.py) || fail "the file after the restart"
echo "hub killed: the file read $killed groups; restored and stopped: $kept"
[ "$kept" -ge "$last" ] && [ "$kept" -le "$killed" ] || fail "groups: $last read live, $killed after the kill, $kept kept"
echo "bus_processes: all checks passed"
