#!/usr/bin/env python3
"""The learner baseline for `rlx bench learner --device cuda`: a plain PyTorch training step
(Python, eager, HF `transformers` Qwen2 model with SDPA attention, fp32 master weights under
bf16 autocast, AdamW) on a Qwen2.5-0.5B-shaped random model, same shapes as rlx's run.

  python3 scripts/bench_torch_train.py [--seq 2048] [--batch-seqs 8] [--steps 5]

Prints tokens/s, step time, peak memory and MFU (against a bf16 GEMM measured in the same
process) as one JSON line, last.
"""
import argparse, json, time

import torch
from transformers import AutoConfig, AutoModelForCausalLM

QWEN25_05B = dict(vocab_size=151936, hidden_size=896, intermediate_size=4864, num_hidden_layers=24,
                  num_attention_heads=14, num_key_value_heads=2, max_position_embeddings=32768,
                  rms_norm_eps=1e-6, rope_theta=1000000.0, tie_word_embeddings=True)


def gemm_tflops():
    a = torch.randn(8192, 8192, device="cuda", dtype=torch.bfloat16)
    b = torch.randn(8192, 8192, device="cuda", dtype=torch.bfloat16)
    for _ in range(3):
        a @ b
    torch.cuda.synchronize()
    t0 = time.perf_counter()
    for _ in range(10):
        a @ b
    torch.cuda.synchronize()
    return 2 * 8192**3 * 10 / (time.perf_counter() - t0) / 1e12


def flops_per_token(c, context):
    # The same count as rlx's bench: 6 per matmul weight (fwd + bwd) plus attention.
    d, q = c.hidden_size, c.num_attention_heads * (c.hidden_size // c.num_attention_heads)
    kv = c.num_key_value_heads * (c.hidden_size // c.num_attention_heads)
    per_layer = d * q * 2 + d * kv * 2 + 3 * d * c.intermediate_size
    return 6 * (c.num_hidden_layers * per_layer + d * c.vocab_size) + 12 * c.num_hidden_layers * q * context


def main():
    ap = argparse.ArgumentParser()
    ap.add_argument("--seq", type=int, default=2048)
    ap.add_argument("--batch-seqs", type=int, default=8)
    ap.add_argument("--steps", type=int, default=5)
    args = ap.parse_args()
    cfg = AutoConfig.for_model("qwen2", **QWEN25_05B)
    torch.manual_seed(0)
    model = AutoModelForCausalLM.from_config(cfg, attn_implementation="sdpa").cuda().train()
    opt = torch.optim.AdamW(model.parameters(), lr=1e-5)
    ids = torch.randint(0, cfg.vocab_size, (args.batch_seqs, args.seq), device="cuda")
    times = []
    for s in range(args.steps + 1):  # step 0 is a warm-up
        torch.cuda.synchronize()
        t0 = time.perf_counter()
        with torch.autocast("cuda", dtype=torch.bfloat16):
            logits = model(ids).logits
        logp = torch.log_softmax(logits[:, :-1].float(), -1).gather(-1, ids[:, 1:, None]).squeeze(-1)
        loss = -logp.mean()
        loss.backward()
        torch.nn.utils.clip_grad_norm_(model.parameters(), 1.0)
        opt.step()
        opt.zero_grad(set_to_none=True)
        del logits, logp, loss
        torch.cuda.synchronize()
        if s > 0:
            times.append(time.perf_counter() - t0)
    times.sort()
    step_s = times[len(times) // 2]
    tokens = args.batch_seqs * args.seq
    peak = gemm_tflops()
    achieved = flops_per_token(cfg, args.seq / 2) * tokens / step_s / 1e12
    print(json.dumps({"bench": "torch_train", "torch": torch.__version__, "gpu": torch.cuda.get_device_name(),
                      "seq": args.seq, "batch_seqs": args.batch_seqs, "tokens_per_step": tokens, "step_s": step_s,
                      "tokens_per_s": tokens / step_s, "peak_mb": torch.cuda.max_memory_allocated() / 2**20,
                      "achieved_tflops": achieved, "gemm_peak_tflops": peak, "mfu": achieved / peak}))


if __name__ == "__main__":
    main()
