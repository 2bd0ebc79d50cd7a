# Checks shared by the e2e and Slurm suites (sourced).

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
