#!/usr/bin/env python3
"""HF transformers <-> rlx parity (run on a machine with `transformers`, e.g. the CUDA machine).

  python3 scripts/hf_parity.py --rlx build/cuda/rlx --out $OUT/parity

For llama, qwen2, qwen3, mistral, qwen3_moe and mixtral: builds a random-weight model with transformers
(from_config + save_pretrained), has rlx load it and print logits for fixed
token ids (`rlx model logits`), and compares; then has rlx write a model
(`rlx model init`) and checks that transformers loads it to the same logits.
Writes parity.json (max abs differences) and prints it as the last line.
"""
import argparse, json, os, subprocess, sys

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


def rlx_logits(rlx, model_dir, dtype, device="cpu"):
    out = subprocess.run([rlx, "model", "logits", "--model", model_dir, "--dtype", dtype, "--device", device,
                          "--tokens", json.dumps(TOKENS)], check=True, capture_output=True, text=True,
                         timeout=120).stdout
    return torch.tensor(json.loads(out.strip().splitlines()[-1])["logits"])


def hf_logits(model_dir, dtype, device="cpu"):
    m = AutoModelForCausalLM.from_pretrained(model_dir, dtype=dtype, attn_implementation="eager").to(device).eval()
    with torch.no_grad():
        return m(torch.tensor(TOKENS, device=device)).logits.float().cpu()


def main():
    ap = argparse.ArgumentParser()
    ap.add_argument("--rlx", required=True)
    ap.add_argument("--out", required=True)
    ap.add_argument("--device", default="cpu", help="where the bf16 comparisons run (cpu or cuda)")
    args = ap.parse_args()
    os.makedirs(args.out, exist_ok=True)
    results = {}
    for model_type in FAMILY:
        torch.manual_seed(0)
        cfg = AutoConfig.for_model(model_type, **{**SHAPE, **FAMILY[model_type]})
        hf = AutoModelForCausalLM.from_config(cfg).eval()
        d = os.path.join(args.out, f"hf_{model_type}")
        hf.save_pretrained(d, safe_serialization=True)
        ref = hf_logits(d, torch.float32)
        results[f"{model_type}_hf_to_rlx_fp32_max_abs"] = (rlx_logits(args.rlx, d, "float32") - ref).abs().max().item()
        # bf16: rlx and HF each in bf16 on the device against the fp32 reference, so the
        # tolerance is stated relative to HF's own bf16 error on the same inputs.
        hf_bf16 = hf_logits(d, torch.bfloat16, args.device)
        rlx_bf16 = rlx_logits(args.rlx, d, "bfloat16", args.device)
        results[f"{model_type}_hf_to_rlx_bf16_max_abs"] = (rlx_bf16 - ref).abs().max().item()
        results[f"{model_type}_hf_bf16_own_max_abs"] = (hf_bf16 - ref).abs().max().item()
        results[f"{model_type}_rlx_vs_hf_bf16_max_abs"] = (rlx_bf16 - hf_bf16).abs().max().item()
        results[f"{model_type}_hf_to_rlx_fp32_{args.device}_max_abs"] = (
            rlx_logits(args.rlx, d, "float32", args.device) - ref).abs().max().item()
        r = os.path.join(args.out, f"rlx_{model_type}")
        subprocess.run([args.rlx, "model", "init", "--arch", model_type, "--preset", PRESET.get(model_type, "tiny"), "--out", r, "--seed", "3"],
                       check=True, timeout=120)
        results[f"{model_type}_rlx_to_hf_fp32_max_abs"] = (hf_logits(r, torch.float32) - rlx_logits(args.rlx, r, "float32")).abs().max().item()
    with open(os.path.join(args.out, "parity.json"), "w") as f:
        json.dump(results, f, indent=2)
    print(json.dumps(results))
    # fp32 within 1e-4; rlx's bf16 error no more than twice HF's own bf16 error.
    ok = all(v <= 1e-4 for k, v in results.items() if "fp32" in k) and all(
        results[f"{m}_hf_to_rlx_bf16_max_abs"] <= 2 * max(results[f"{m}_hf_bf16_own_max_abs"], 1e-3)
        for m in FAMILY)
    sys.exit(0 if ok else 1)


if __name__ == "__main__":
    main()
