#!/usr/bin/env python3
"""One JSON line of a run's metrics.jsonl: the figures issue 53 sets goals on for a colocated
run (the device's busy share, the step against generation and training, the weight hand-over)
and what its CUDA graphs cost, as means over the steps after the first (which loads, captures
and warms up), with the first step's own.

    python3 scripts/run_metrics_summary.py RUN_DIR/metrics.jsonl NAME    (cuda_check.sh)
"""
import json
import sys

KEYS = ("step_s", "generate_s", "train_s", "sync_s", "wait_s", "busy_device", "weight_copy_s", "graph_steps",
        "graph_captures", "graph_capture_s", "reward_mean", "tokens_per_s", "peak_mem_mb_learner", "kv_pool_mb")


def main():
    path, name = sys.argv[1], sys.argv[2]
    lines = [json.loads(line) for line in open(path) if line.strip()]
    out = {"bench": "run_metrics", "run": name, "steps": len(lines)}
    if lines:
        out["first"] = {k: lines[0][k] for k in KEYS if k in lines[0]}
        rest = lines[1:] or lines
        out["mean_after_first"] = {k: sum(x[k] for x in rest) / len(rest) for k in KEYS if all(k in x for x in rest)}
        out["last"] = {k: lines[-1][k] for k in ("step", "reward_mean", "val_accuracy") if k in lines[-1]}
    print(json.dumps(out))


if __name__ == "__main__":
    main()
