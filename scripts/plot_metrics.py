#!/usr/bin/python3
"""Plots a run's main curves from metrics.jsonl into PNG files beside it.

    scripts/plot_metrics.py runs/grpo_arithmetic            # writes runs/grpo_arithmetic/plots/*.png
"""
import json
import pathlib
import sys

import matplotlib

matplotlib.use("Agg")
import matplotlib.pyplot as plt  # noqa: E402

CURVES = [  # (file, title, keys)
    ("reward.png", "reward (mean over samples)", ["reward_mean"]),
    ("loss.png", "loss", ["loss", "pg_loss"]),
    ("kl_entropy.png", "KL to reference / behaviour mismatch / entropy", ["kl", "mismatch_kl", "entropy"]),
    ("length.png", "response length (tokens)", ["response_length_mean", "response_length_max"]),
    ("throughput.png", "tokens/s", ["tokens_per_s"]),
    ("time.png", "seconds per step: generate / train / sync / wait", ["step_s", "generate_s", "train_s", "sync_s", "wait_s"]),
    ("busy.png", "busy fraction of the step", ["busy_device", "busy_learner", "busy_rollout"]),
    ("memory.png", "peak memory (MiB; device on CUDA, resident on CPU)", "peak_mem_mb_"),
    # validation.every_steps: greedy accuracy, mean@n, pass@k, maj@n on held-out tasks
    ("validation.png", "validation (held-out tasks)", ["val/greedy_acc", "val/mean@", "val/pass@", "val/maj@"]),
]


def by_k(rows, prefix):
    """The keys that start with prefix ("val/pass@"), in the order of the number after it."""
    found = {k for r in rows for k in r if k.startswith(prefix)}
    return sorted(found, key=lambda k: (len(k), k))


def main() -> int:
    if len(sys.argv) != 2:
        print(__doc__.strip(), file=sys.stderr)
        return 2
    run = pathlib.Path(sys.argv[1])
    rows = []
    for n, line in enumerate((run / "metrics.jsonl").read_text().splitlines(), 1):
        try:
            rows.append(json.loads(line))
        except json.JSONDecodeError as e:
            print(f"{run / 'metrics.jsonl'}:{n}: not JSON ({e}); skipped", file=sys.stderr)
    if not rows:
        print(f"{run / 'metrics.jsonl'}: no steps to plot", file=sys.stderr)
        return 1
    out = run / "plots"
    out.mkdir(exist_ok=True)
    steps = [r["step"] for r in rows]
    for name, title, keys in CURVES:
        if isinstance(keys, str):  # a prefix: every key that starts with it (one per role)
            keys = sorted({k for r in rows for k in r if k.startswith(keys)})
        else:  # "val/pass@": every pass@k of the run, by k
            keys = [m for k in keys for m in (by_k(rows, k) if k.endswith("@") else [k])]
        present = [k for k in keys if any(k in r for r in rows)]
        if not present:
            continue
        fig, ax = plt.subplots(figsize=(6, 3.5))
        for k in present:
            # only the steps that have it: validation comes every few steps (and at step 0)
            xs = [s for s, r in zip(steps, rows) if k in r]
            ax.plot(xs, [r[k] for r in rows if k in r], label=k, marker="o" if len(xs) < len(rows) else None)
        ax.set_xlabel("step")
        ax.set_title(title)
        ax.grid(alpha=0.3)
        ax.legend()
        fig.tight_layout()
        fig.savefig(out / name, dpi=100)
        plt.close(fig)
    print(out)
    return 0


if __name__ == "__main__":
    sys.exit(main())
