#!/usr/bin/env python3
"""HF transformers <-> rlx parity (run on a machine with `transformers`, e.g. the CUDA machine).

  python3 scripts/hf_parity.py --rlx build/cuda/rlx --out $OUT/parity [--families qwen3_moe,mixtral]

For llama, qwen2, qwen3, mistral, qwen3_moe and mixtral: builds a random-weight model with transformers
(from_config + save_pretrained), has rlx load it and print logits for fixed
token ids (`rlx model logits`), and compares; then has rlx write a model
(`rlx model init`) and checks that transformers loads it to the same logits. The
mixtures of experts are also saved with save_original_format=False (transformers v5's
packed experts), which rlx must load to the same logits, and the expert tensors' names and
shapes each save wrote are recorded.

Each family runs on its own: a failure (with the rlx command's stderr) is recorded and the
next family runs. Writes parity.json and prints it as the last line:
{"results": {...max abs differences...}, "layouts": {...}, "failures": [...], "ok": bool};
the exit code is 1 when a family failed or a difference is out of tolerance.
"""
import argparse, inspect, json, os, re, subprocess, sys, traceback

import torch
from transformers import AutoConfig, AutoModelForCausalLM

SHAPE = dict(vocab_size=512, hidden_size=64, intermediate_size=176, num_hidden_layers=2,
             num_attention_heads=4, num_key_value_heads=2, head_dim=16, max_position_embeddings=2048,
             rms_norm_eps=1e-6, rope_theta=10000.0, tie_word_embeddings=False)
TOKENS = [[1, 17, 300, 42, 5, 511, 0, 77], [9, 8, 7, 6, 5, 4, 3, 2]]
# Each family's own fields on the shape; the sparse ones have 8 experts (top 2) of width 64,
# and qwen3_moe a dense layer (mlp_only_layers) beside a sparse one.
FAMILY = {
    "llama": {}, "qwen2": {}, "qwen3": {}, "mistral": dict(sliding_window=None),
    "qwen3_moe": dict(num_experts=8, num_experts_per_tok=2, moe_intermediate_size=64, norm_topk_prob=True,
                      decoder_sparse_step=1, mlp_only_layers=[0]),
    "mixtral": dict(num_local_experts=8, num_experts_per_tok=2, intermediate_size=64, sliding_window=None),
}
PRESET = {"qwen3_moe": "tiny-moe", "mixtral": "tiny-moe"}
MOE = {"qwen3_moe", "mixtral"}
STDERR_TAIL = 4000  # characters of a failed rlx command's stderr kept in its failure record


class RlxFailed(Exception):
    def __init__(self, cmd, rc, stderr):
        super().__init__(f"{' '.join(cmd)} exited with {rc}")
        self.cmd, self.rc, self.stderr = cmd, rc, stderr


def run_rlx(cmd):
    try:
        p = subprocess.run(cmd, capture_output=True, text=True, timeout=120)
    except subprocess.TimeoutExpired as e:
        err = e.stderr.decode(errors="replace") if isinstance(e.stderr, bytes) else (e.stderr or "")
        raise RlxFailed(cmd, "timeout after 120 s", err)
    if p.returncode != 0:
        raise RlxFailed(cmd, p.returncode, p.stderr)
    return p.stdout


def rlx_logits(rlx, model_dir, dtype, device="cpu"):
    out = run_rlx([rlx, "model", "logits", "--model", model_dir, "--dtype", dtype, "--device", device,
                   "--tokens", json.dumps(TOKENS)])
    return torch.tensor(json.loads(out.strip().splitlines()[-1])["logits"])


def hf_logits(model_dir, dtype, device="cpu"):
    m = AutoModelForCausalLM.from_pretrained(model_dir, dtype=dtype, attn_implementation="eager").to(device).eval()
    with torch.no_grad():
        return m(torch.tensor(TOKENS, device=device)).logits.float().cpu()


def saved_layout(model_dir):
    """The expert and router tensors a save wrote: names with layer and expert numbers as N, and shapes."""
    from safetensors import safe_open
    seen = {}
    for f in sorted(os.listdir(model_dir)):
        if f.endswith(".safetensors"):
            with safe_open(os.path.join(model_dir, f), framework="pt") as st:
                for k in st.keys():
                    if ".experts." in k or k.endswith(".gate.weight"):
                        seen.setdefault(re.sub(r"\.\d+\.", ".N.", k), list(st.get_slice(k).get_shape()))
    return seen


def check_family(model_type, args, results, layouts, step):
    torch.manual_seed(0)
    step[0] = "transformers builds and saves the model"
    cfg = AutoConfig.for_model(model_type, **{**SHAPE, **FAMILY[model_type]})
    hf = AutoModelForCausalLM.from_config(cfg).eval()
    d = os.path.join(args.out, f"hf_{model_type}")
    hf.save_pretrained(d, safe_serialization=True)
    if model_type in MOE:
        layouts[f"{model_type}_save_pretrained"] = saved_layout(d)
    step[0] = "HF logits, fp32"
    ref = hf_logits(d, torch.float32)
    step[0] = "HF -> rlx, fp32 on cpu"
    results[f"{model_type}_hf_to_rlx_fp32_max_abs"] = (rlx_logits(args.rlx, d, "float32") - ref).abs().max().item()
    # bf16: rlx and HF each in bf16 on the device against the fp32 reference, so the
    # tolerance is stated relative to HF's own bf16 error on the same inputs.
    step[0] = f"HF -> rlx, bf16 on {args.device}"
    hf_bf16 = hf_logits(d, torch.bfloat16, args.device)
    rlx_bf16 = rlx_logits(args.rlx, d, "bfloat16", args.device)
    results[f"{model_type}_hf_to_rlx_bf16_max_abs"] = (rlx_bf16 - ref).abs().max().item()
    results[f"{model_type}_hf_bf16_own_max_abs"] = (hf_bf16 - ref).abs().max().item()
    results[f"{model_type}_rlx_vs_hf_bf16_max_abs"] = (rlx_bf16 - hf_bf16).abs().max().item()
    step[0] = f"HF -> rlx, fp32 on {args.device}"
    results[f"{model_type}_hf_to_rlx_fp32_{args.device}_max_abs"] = (
        rlx_logits(args.rlx, d, "float32", args.device) - ref).abs().max().item()
    if model_type in MOE and "save_original_format" in inspect.signature(hf.save_pretrained).parameters:
        # transformers v5's own layout: packed experts [E, 2I, H] and [E, H, I] under mlp.
        step[0] = "HF (save_original_format=False, packed experts) -> rlx, fp32 on cpu"
        p = os.path.join(args.out, f"hf_{model_type}_packed")
        hf.save_pretrained(p, safe_serialization=True, save_original_format=False)
        layouts[f"{model_type}_save_original_format_false"] = saved_layout(p)
        results[f"{model_type}_hf_packed_to_rlx_fp32_max_abs"] = (
            rlx_logits(args.rlx, p, "float32") - ref).abs().max().item()
    step[0] = "rlx model init"
    r = os.path.join(args.out, f"rlx_{model_type}")
    run_rlx([args.rlx, "model", "init", "--arch", model_type, "--preset", PRESET.get(model_type, "tiny"), "--out", r,
             "--seed", "3"])
    step[0] = "rlx -> HF, fp32"
    results[f"{model_type}_rlx_to_hf_fp32_max_abs"] = (hf_logits(r, torch.float32) - rlx_logits(args.rlx, r, "float32")).abs().max().item()


def main():
    ap = argparse.ArgumentParser()
    ap.add_argument("--rlx", required=True)
    ap.add_argument("--out", required=True)
    ap.add_argument("--device", default="cpu", help="where the bf16 comparisons run (cpu or cuda)")
    ap.add_argument("--families", default=",".join(FAMILY), help="comma-separated model types")
    args = ap.parse_args()
    families = [f for f in args.families.split(",") if f]
    unknown = [f for f in families if f not in FAMILY]
    if unknown:
        ap.error(f"unknown families {unknown}; known: {', '.join(FAMILY)}")
    os.makedirs(args.out, exist_ok=True)
    results, layouts, failures, done = {}, {}, [], []
    for model_type in families:
        step = ["start"]
        try:
            check_family(model_type, args, results, layouts, step)
            done.append(model_type)
        except Exception as e:  # one family's failure must not hide the others'
            record = {"family": model_type, "step": step[0], "error": f"{type(e).__name__}: {e}"}
            if isinstance(e, RlxFailed):
                record.update(cmd=e.cmd, rc=e.rc, rlx_stderr=e.stderr[-STDERR_TAIL:])
            else:
                record["traceback"] = traceback.format_exc()[-STDERR_TAIL:]
            failures.append(record)
            print(f"{model_type}: FAILED at {step[0]}: {e}", file=sys.stderr)
            if isinstance(e, RlxFailed):
                print(e.stderr[-STDERR_TAIL:], file=sys.stderr)
        # What is known so far, after each family: a run cut by its time limit keeps it.
        print(json.dumps({"family": model_type, "done": model_type in done,
                          "results": {k: v for k, v in results.items() if k.startswith(model_type + "_")}}))
        with open(os.path.join(args.out, "parity.partial.json"), "w") as f:
            json.dump({"results": results, "layouts": layouts, "failures": failures, "done": done}, f, indent=2)
    # fp32 within 1e-4; rlx's bf16 error no more than twice HF's own bf16 error.
    in_tolerance = all(v <= 1e-4 for k, v in results.items() if "fp32" in k) and all(
        results[f"{m}_hf_to_rlx_bf16_max_abs"] <= 2 * max(results[f"{m}_hf_bf16_own_max_abs"], 1e-3)
        for m in done)
    out = {"results": results, "layouts": layouts, "families": families,
           "failed": [f["family"] for f in failures], "failures": failures,
           "ok": in_tolerance and not failures}
    with open(os.path.join(args.out, "parity.json"), "w") as f:
        json.dump(out, f, indent=2)
    print(json.dumps(out))
    sys.exit(0 if out["ok"] else 1)


if __name__ == "__main__":
    main()
