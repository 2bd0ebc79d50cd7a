#!/usr/bin/env python3
"""The figures of a CUDA check (scripts/cuda_check.sh's results.jsonl) against issue 53's goals.

  python3 scripts/cuda_summary.py OUT/results.jsonl

Decode against the memory roofline (the copy bandwidth the `ceilings` step measured, the
Qwen2.5-0.5B shape's weight bytes and KV bytes at the mean context) and against its peers at
the same batch; the learner against PyTorch's step and the GEMM ceiling; every step's rc.
"""
import json, sys

WEIGHT_BYTES = 494_032_768 * 2          # Qwen2.5-0.5B, bf16, tied embeddings
KV_BYTES_PER_TOKEN = 2 * 24 * 2 * 64 * 2  # K and V, 24 layers, 2 KV heads of 64, bf16
DECODE_GOALS = {1: 0.30, 64: 0.40, 256: 0.50}


def main():
    rows = [json.loads(line) for line in open(sys.argv[1]) if line.strip()]
    by_step = {}
    for r in rows:
        by_step.setdefault(r["step"], []).append(r)

    def result(name):
        rs = by_step.get(name, [])
        return rs[-1]["result"] if rs and isinstance(rs[-1].get("result"), dict) else None

    lines = []
    first = rows[0] if rows else {}
    lines.append(f"commit {first.get('commit')} on {first.get('device')}")
    ceil = result("ceilings") or {}
    bw = ceil.get("copy_gbs", 3000.0) * 1e9
    gemm = ceil.get("bf16_gemm_tflops")
    lines.append(f"ceilings: copy {bw / 1e9:,.0f} GB/s, bf16 GEMM {gemm or float('nan'):.0f} TFLOP/s")

    peers = {}
    for r in by_step.get("peers", []):
        p = r.get("result") or {}
        if "decode_step_ms" in p:
            peers[(p["peer"], p["batch"])] = p["decode_step_ms"]
        elif p.get("peer"):
            peers.setdefault((p["peer"], p["batch"]), p.get("error", "no result"))
    lines.append("decode (Qwen2.5-0.5B shape, bf16, prompt 512 + 128 new, CUDA graphs + overlap):")
    lines.append(f"  {'batch':>5} {'step ms':>8} {'roofline ms':>11} {'of roofline':>11} {'goal':>5} "
                 f"{'vs compiled':>11} {'vs HF':>7} {'kernels/step':>12} {'busy':>5}")
    for b, goal in DECODE_GOALS.items():
        d = result(f"decode_b{b}")
        if not d or "decode_step_ms" not in d:
            lines.append(f"  {b:>5} (no result)")
            continue
        ms = d["decode_step_ms"]
        roof = (WEIGHT_BYTES + b * (512 + 64) * KV_BYTES_PER_TOKEN) / bw * 1e3
        comp, hf = peers.get(("compiled", b)), peers.get(("hf", b))
        vs = lambda p: f"{p / ms:.2f}x" if isinstance(p, float) else "-"
        t = d.get("trace") or {}
        busy = t.get("busy_us_per_step", 0) / 1e3 / ms if t else 0
        lines.append(f"  {b:>5} {ms:>8.3f} {roof:>11.3f} {roof / ms:>10.1%} {goal:>5.0%} {vs(comp):>11} {vs(hf):>7} "
                     f"{t.get('launches_per_step', 0):>12.0f} {busy:>5.0%}  graphs {d.get('graph_steps')}"
                     f" ({d.get('graph_captures')} captured in {d.get('graph_capture_s', 0):.2f} s"
                     + (f"; {d['capture_steps']} steps that captured, not in the step time)" if "capture_steps" in d else ")")
                     + f"  setup {d.get('setup_s', 0):.0f} s")
        # The variants at this batch (decode_bB_gemv, _tiled, _pdl, ...): the same row.
        for step in sorted(k for k in by_step if k.startswith(f"decode_b{b}_")):
            v = result(step) or {}
            if "decode_step_ms" not in v:
                lines.append(f"        {step[len(f'decode_b{b}_'):]}: {str(v.get('error', 'no result'))[:200]}")
                continue
            vt = v.get("trace") or {}
            vms = v["decode_step_ms"]
            lines.append(f"        {step[len(f'decode_b{b}_'):]:<16} {vms:>8.3f} ms {roof / vms:>6.1%} of the roofline, "
                         f"{ms / vms:.2f}x the default" +
                         (f", {vt.get('launches_per_step', 0):.0f} kernels a step" if vt else ""))
    for (peer, b), v in sorted(peers.items()):
        lines.append(f"  peer {peer} batch {b}: " + (f"{v:.3f} ms a step" if isinstance(v, float) else str(v)[:200]))

    torch_l, rlx_l = result("learner_torch"), result("learner")
    if torch_l and rlx_l:
        run = (rlx_l.get("runs") or [rlx_l])[0] if isinstance(rlx_l.get("runs"), list) else rlx_l
        tps = run.get("tokens_per_s")
        lines.append(f"learner 8 x 2048: rlx {tps or 0:,.0f} tokens/s, PyTorch {torch_l['tokens_per_s']:,.0f} "
                     f"-> {(tps or 0) / torch_l['tokens_per_s']:.2f}x (goal 1.1x); PyTorch MFU {torch_l['mfu']:.1%}")
        aten = result("learner_aten_ops")
        if aten and isinstance(aten.get("runs"), list):
            lines.append(f"  rlx with LibTorch's ops in the head, RMSNorm, RoPE and SiLU-mul: "
                         f"{aten['runs'][0].get('tokens_per_s', 0):,.0f} tokens/s")
    elif torch_l or rlx_l:
        lines.append(f"learner: torch {json.dumps(torch_l)[:300]} rlx {json.dumps(rlx_l)[:300]}")

    # The other steps' headline figures, a line each (their whole JSON is in results.jsonl).
    keys = ("output_tokens_per_s", "decode_step_ms", "graph_steps", "graph_captures", "graph_capture_s", "sampling",
            "tokens_per_s", "step_s", "ok", "failed", "gbs", "ms_per_version", "reward_mean", "accuracy", "passed",
            "error")
    shown = {"ceilings", "peers", "learner_torch", "learner", "learner_aten_ops"} | {f"decode_b{b}" for b in DECODE_GOALS}
    # The variants listed under their batch above (where its default has a step time).
    shown |= {k for k in by_step for b in DECODE_GOALS
              if k.startswith(f"decode_b{b}_") and "decode_step_ms" in (result(f"decode_b{b}") or {})}
    for name in by_step:
        r = result(name)
        if name in shown or not r:
            continue
        if r.get("bench") == "run_metrics":  # a run's metrics (run_metrics_summary.py): the colocated goals
            m = r.get("mean_after_first", {})
            figures = [f"{k} {m[k]:.3g}" for k in ("step_s", "generate_s", "train_s", "busy_device", "weight_copy_s",
                                                   "graph_captures", "graph_capture_s", "reward_mean") if k in m]
            lines.append(f"  {name}: {r.get('steps')} steps; a step after the first: " + ", ".join(figures))
            continue
        picked = {k: r[k] for k in keys if k in r}
        lines.append(f"  {name}: " + json.dumps(picked or r)[:240])

    lines.append("steps (rc, seconds):")
    for r in rows:
        if r["step"] == "peers" and r is not by_step["peers"][-1]:
            continue
        lines.append(f"  {r['step']:<28} rc {r['rc']:>3} {r['seconds']:>5} s")
    print("\n".join(lines))


if __name__ == "__main__":
    main()
