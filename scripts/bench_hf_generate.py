#!/usr/bin/env python3
"""rlx's rollout engine vs HF `transformers` generate, same weights, same run (CUDA machine).

  python3 scripts/bench_hf_generate.py --rlx build/cuda/rlx --out $OUT/sampler [--batches 1,64,256]

Builds a Qwen2.5-0.5B-shaped model with random weights (from_config, bf16), saves
it, then for each batch size generates `--new` tokens after `--prompt` random
prompt tokens: once with HF `generate` (sampling, no early stop), once with HF's static
KV cache and the forward under torch.compile (reduce-overhead: CUDA graphs; the fastest
plain-PyTorch peer, `--compiled 0` skips it), once with `rlx bench sampler --model DIR`. Reports output tokens/s, peak device memory and
the decode roofline (bandwidth / (weight bytes + batch x context x KV bytes per
token)); writes sampler.json and prints it as the last line.
"""
import argparse, json, os, subprocess, time

import torch
from transformers import AutoConfig, AutoModelForCausalLM

QWEN25_05B = dict(vocab_size=151936, hidden_size=896, intermediate_size=4864, num_hidden_layers=24,
                  num_attention_heads=14, num_key_value_heads=2, max_position_embeddings=32768,
                  rms_norm_eps=1e-6, rope_theta=1000000.0, tie_word_embeddings=True)


def hf_generate(model, batch, prompt, new):
    torch.manual_seed(0)
    ids = torch.randint(0, model.config.vocab_size, (batch, prompt), device="cuda")
    model.generate(ids[:, :8], max_new_tokens=4, min_new_tokens=4, do_sample=True)  # warm-up
    torch.cuda.synchronize()
    torch.cuda.reset_peak_memory_stats()
    t0 = time.perf_counter()
    out = model.generate(ids, attention_mask=torch.ones_like(ids), max_new_tokens=new, min_new_tokens=new,
                         do_sample=True, temperature=1.0, top_k=0, top_p=1.0, pad_token_id=0)
    torch.cuda.synchronize()
    dt = time.perf_counter() - t0
    assert out.shape[1] == prompt + new
    return {"output_tokens_per_s": batch * new / dt, "seconds": dt,
            "peak_mb": torch.cuda.max_memory_allocated() / 2**20}


def compiled_generate(model, batch, prompt, new):
    """The fastest plain-PyTorch peer: HF's static KV cache with the forward compiled by
    torch.compile (mode reduce-overhead: CUDA graphs), sampling as HF does. The decode step
    is the whole generation's time less a one-token generation's (the prefill), per token."""
    torch.manual_seed(0)
    ids = torch.randint(0, model.config.vocab_size, (batch, prompt), device="cuda")
    mask = torch.ones_like(ids)
    forward = model.forward
    model.forward = torch.compile(forward, mode="reduce-overhead", fullgraph=True)
    kw = dict(attention_mask=mask, do_sample=True, temperature=1.0, top_k=0, top_p=1.0, pad_token_id=0,
              cache_implementation="static")
    try:
        for _ in range(2):  # compile and capture at these shapes
            model.generate(ids, max_new_tokens=new, min_new_tokens=new, **kw)
        torch.cuda.synchronize()
        t0 = time.perf_counter()
        model.generate(ids, max_new_tokens=1, min_new_tokens=1, **kw)
        torch.cuda.synchronize()
        prefill = time.perf_counter() - t0
        torch.cuda.reset_peak_memory_stats()
        t0 = time.perf_counter()
        out = model.generate(ids, max_new_tokens=new, min_new_tokens=new, **kw)
        torch.cuda.synchronize()
        dt = time.perf_counter() - t0
    finally:
        model.forward = forward
    assert out.shape[1] == prompt + new
    return {"output_tokens_per_s": batch * new / dt, "seconds": dt,
            "decode_step_ms": (dt - prefill) * 1e3 / max(1, new - 1),
            "peak_mb": torch.cuda.max_memory_allocated() / 2**20}


def main():
    ap = argparse.ArgumentParser()
    ap.add_argument("--rlx", required=True)
    ap.add_argument("--out", required=True)
    ap.add_argument("--batches", default="1,64,256")
    ap.add_argument("--prompt", type=int, default=512)
    ap.add_argument("--new", type=int, default=512)
    ap.add_argument("--bandwidth-gbs", type=float, default=3000.0, help="device-to-device copy bandwidth")
    ap.add_argument("--compiled", type=int, default=1, help="also time the torch.compile static-cache peer (1/0)")
    args = ap.parse_args()
    os.makedirs(args.out, exist_ok=True)
    model_dir = os.path.join(args.out, "qwen2.5-0.5b-random")
    cfg = AutoConfig.for_model("qwen2", **QWEN25_05B)
    torch.manual_seed(0)
    model = AutoModelForCausalLM.from_config(cfg, dtype=torch.bfloat16).cuda().eval()
    model.save_pretrained(model_dir, safe_serialization=True)
    weight_bytes = sum(p.numel() * p.element_size() for p in model.parameters())
    kv_per_token = 2 * cfg.num_hidden_layers * cfg.num_key_value_heads * (cfg.hidden_size // cfg.num_attention_heads) * 2

    rows = []
    for b in [int(x) for x in args.batches.split(",")]:
        # Mean context over the decode: prompt + new / 2.
        ctx = args.prompt + args.new / 2
        roofline = b * args.bandwidth_gbs * 1e9 / (weight_bytes + b * ctx * kv_per_token)
        row = {"batch": b, "roofline_output_tokens_per_s": roofline}
        # rlx first, then HF, then the compiled peer (the slowest to set up): each result is
        # printed as it lands, so a run cut short by its time limit still reports the ones done.
        proc = subprocess.run([args.rlx, "bench", "sampler", "--model", model_dir, "--dtype", "bfloat16",
                               "--device", "cuda", "--batch", str(b), "--prompt", str(args.prompt), "--new",
                               str(args.new), "--iters", "1", "--kv-cache-mb", "16384",
                               "--max-batch-tokens", "16384"], capture_output=True, text=True, timeout=600)
        rlx = {"error": proc.stderr[-2000:]} if proc.returncode != 0 else json.loads(proc.stdout.strip().splitlines()[-1])
        row["rlx"] = rlx
        if "decode_step_ms" in rlx:
            row["rlx_decode_fraction_of_roofline"] = (b * 1e3 / rlx["decode_step_ms"]) / roofline
        print(json.dumps(row), flush=True)
        with torch.no_grad():
            row["hf"] = hf = hf_generate(model, b, args.prompt, args.new)
        torch.cuda.empty_cache()
        if "output_tokens_per_s" in rlx:
            row["rlx_vs_hf"] = rlx["output_tokens_per_s"] / hf["output_tokens_per_s"]
        print(json.dumps(row), flush=True)
        if args.compiled:
            try:
                compiled = compiled_generate(model, b, args.prompt, args.new)
            except Exception as e:  # a transformers or torch without the static-cache path
                compiled = {"error": f"{type(e).__name__}: {e}"[:2000]}
            torch.cuda.empty_cache()
            row["compiled"] = compiled
            if "decode_step_ms" in compiled and "decode_step_ms" in rlx:
                row["rlx_vs_compiled_decode"] = compiled["decode_step_ms"] / rlx["decode_step_ms"]
                row["compiled_decode_fraction_of_roofline"] = (b * 1e3 / compiled["decode_step_ms"]) / roofline
            print(json.dumps(row), flush=True)
        rows.append(row)
    result = {"bench": "sampler_vs_hf", "gpu": torch.cuda.get_device_name(), "prompt": args.prompt, "new": args.new,
              "weight_bytes": weight_bytes, "kv_bytes_per_token": kv_per_token, "rows": rows}
    with open(os.path.join(args.out, "sampler.json"), "w") as f:
        json.dump(result, f, indent=1)
    print(json.dumps(result))


if __name__ == "__main__":
    main()
