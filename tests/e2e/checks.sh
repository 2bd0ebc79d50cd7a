# Checks and fixtures shared by the e2e and Slurm suites (sourced).

# write_gsm8k FILE: 40 GSM8K-style lines ({"question", "answer"} with "#### n"), the math
# environment's hub.dataset in the sampling and validation tests.
write_gsm8k() {
  python3 - "$1" <<'P'
import json, sys
with open(sys.argv[1], "w") as f:
    for i in range(40):
        a, b = i % 7 + 2, i % 5 + 3
        f.write(json.dumps({"question": f"Tom has {a} apples and buys {b} more. How many now?",
                            "answer": f"He has {a} + {b} = {a + b} apples.\n#### {a + b}"}) + "\n")
P
}

# workers_stopped_first RUN_DIR: prints what is wrong, nothing when the run ended in order.
# The learner done, each worker stops while the hub is there to take what it holds, then
# the hub: no worker asked a stopped hub (in task mode one did for 30 s, every run), and
# by the logs' time stamps each worker's stop comes no later than the hub's.
workers_stopped_first() {
  local run=$1 hub_end w t
  grep -l "nothing from the hub" "$run"/logs/worker-*/rank-0.err
  hub_end=$(grep -h "hub: stopped;" "$run/logs/hub-0/rank-0.err" | cut -c1-23)
  for w in 0 1; do
    t=$(grep -h "stopped (SIGTERM)" "$run/logs/worker-$w/rank-0.err" | cut -c1-23)
    [ -n "$t" ] && [ -n "$hub_end" ] && [[ ! $t > $hub_end ]] || echo "worker $w stopped at '$t', the hub at '$hub_end'"
  done
}
