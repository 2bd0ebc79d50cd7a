#!/usr/bin/env python3
"""The learner baseline for `rlx bench learner --device cuda`: a plain PyTorch training step
(Python, eager, HF `transformers` Qwen2 model with SDPA attention, fp32 master weights under
bf16 autocast, AdamW) on a Qwen2.5-0.5B-shaped random model, same shapes as rlx's run.

  python3 scripts/bench_torch_train.py [--seq 2048] [--batch-seqs 8] [--steps 5] [--profile DIR]

Prints tokens/s, step time, peak memory and MFU (against a bf16 GEMM measured in the same
process) as one JSON line, last. With --profile, one more step under torch.profiler: its
operator table by device time (DIR/ops.txt, as `rlx bench learner --profile`'s) and its
kernels (DIR/kernels.csv, as `rlx bench learner --trace`'s).
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


def profile(step, out):
    import os
    from torch.profiler import ProfilerActivity, profile as torch_profile
    os.makedirs(out, exist_ok=True)
    with torch_profile(activities=[ProfilerActivity.CPU, ProfilerActivity.CUDA]) as prof:
        step()
        torch.cuda.synchronize()
    with open(os.path.join(out, "ops.txt"), "w") as f:
        # PyTorch 2.4 renamed the column (compared as numbers: "2.11" is after "2.4").
        version = tuple(int(p) for p in torch.__version__.split("+")[0].split(".")[:2])
        f.write(prof.key_averages().table(sort_by="self_cuda_time_total" if version < (2, 4) else
                                          "self_device_time_total", row_limit=50, max_name_column_width=60))
    kernels = {}
    for e in prof.events():  # the device's kernels are events of their own (device_type CUDA)
        if e.device_type == torch.autograd.DeviceType.CUDA:
            k = kernels.setdefault(e.name, [0, 0.0])
            k[0] += 1
            k[1] += e.time_range.elapsed_us()
    total = sum(v[1] for v in kernels.values()) or 1.0
    with open(os.path.join(out, "kernels.csv"), "w") as f:
        f.write("name,launches_per_step,total_us_per_step,mean_us,share\n")
        for name, (n, us) in sorted(kernels.items(), key=lambda kv: -kv[1][1]):
            f.write('"%s",%d,%.2f,%.3f,%.4f\n' % (name.replace('"', '""'), n, us, us / n, us / total))


def main():
    ap = argparse.ArgumentParser()
    ap.add_argument("--seq", type=int, default=2048)
    ap.add_argument("--batch-seqs", type=int, default=8)
    ap.add_argument("--steps", type=int, default=5)
    ap.add_argument("--profile", default="", help="DIR: one more step under torch.profiler")
    args = ap.parse_args()
    cfg = AutoConfig.for_model("qwen2", **QWEN25_05B)
    torch.manual_seed(0)
    model = AutoModelForCausalLM.from_config(cfg, attn_implementation="sdpa").cuda().train()
    opt = torch.optim.AdamW(model.parameters(), lr=1e-5)
    ids = torch.randint(0, cfg.vocab_size, (args.batch_seqs, args.seq), device="cuda")
    times = []

    def step():
        with torch.autocast("cuda", dtype=torch.bfloat16):
            logits = model(ids).logits
        logp = torch.log_softmax(logits[:, :-1].float(), -1).gather(-1, ids[:, 1:, None]).squeeze(-1)
        loss = -logp.mean()
        loss.backward()
        torch.nn.utils.clip_grad_norm_(model.parameters(), 1.0)
        opt.step()
        opt.zero_grad(set_to_none=True)

    for s in range(args.steps + 1):  # step 0 is a warm-up
        torch.cuda.synchronize()
        t0 = time.perf_counter()
        step()
        torch.cuda.synchronize()
        if s > 0:
            times.append(time.perf_counter() - t0)
    if args.profile:
        profile(step, args.profile)
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
