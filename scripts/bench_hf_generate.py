#!/usr/bin/env python3
"""The decode peers of rlx's rollout engine, on a CUDA machine: HF `transformers` generate and
generate with HF's static KV cache, whose decode step HF compiles (torch.compile, CUDA graphs),
Qwen2.5-0.5B-shaped random weights.

  python3 scripts/bench_hf_generate.py [--peers hf,compiled] [--batches 1,64,256]
      [--compiled-batches 64,1,256] [--limit 150] [--prompt 512] [--new 128]

For each peer and batch size: B random prompts of `--prompt` tokens, `--new` tokens sampled
(temperature 1, no early stop), timed whole and as a one-token generation (the prefill); the
decode step is the difference over new - 1 tokens, comparable with `rlx bench sampler`'s
decode_step_ms on the same shape (scripts/cuda_check.sh's `decode` step). Each result is one
JSON line printed as it lands; each (peer, batch) has its own time limit (`--limit` seconds),
so one slow compile costs only its own line. The compiled peer compiles per batch size, so its
batches run in `--compiled-batches` order (the goal's batch 64 first).
"""
import argparse, json, signal, time

import torch
from transformers import AutoConfig, AutoModelForCausalLM

QWEN25_05B = dict(vocab_size=151936, hidden_size=896, intermediate_size=4864, num_hidden_layers=24,
                  num_attention_heads=14, num_key_value_heads=2, max_position_embeddings=32768,
                  rms_norm_eps=1e-6, rope_theta=1000000.0, tie_word_embeddings=True)


class OutOfTime(Exception):
    pass


def timed_generate(model, ids, new, **kw):
    torch.cuda.synchronize()
    t0 = time.perf_counter()
    out = model.generate(ids, attention_mask=torch.ones_like(ids), max_new_tokens=new, min_new_tokens=new,
                         do_sample=True, temperature=1.0, top_k=0, top_p=1.0, pad_token_id=0, **kw)
    torch.cuda.synchronize()
    assert out.shape[1] == ids.shape[1] + new
    return time.perf_counter() - t0


def run_peer(model, peer, batch, prompt, new):
    torch.manual_seed(0)
    ids = torch.randint(0, model.config.vocab_size, (batch, prompt), device="cuda")
    kw = {}
    if peer == "compiled":
        # HF's static KV cache: generate compiles the decode step itself (torch.compile, its
        # CompileConfig: CUDA graphs), the prefill stays eager, as HF documents for speed.
        torch._dynamo.reset()
        kw = dict(cache_implementation="static")
    t0 = time.perf_counter()
    for _ in range(2 if peer == "compiled" else 1):  # warm-up (compile and capture at these shapes)
        timed_generate(model, ids, new if peer == "compiled" else 4, **kw)
    warm = time.perf_counter() - t0
    prefill = timed_generate(model, ids, 1, **kw)
    torch.cuda.reset_peak_memory_stats()
    whole = timed_generate(model, ids, new, **kw)
    row = {"output_tokens_per_s": batch * new / whole, "seconds": whole, "prefill_s": prefill,
           "decode_step_ms": (whole - prefill) * 1e3 / max(1, new - 1), "warmup_s": warm,
           "peak_mb": torch.cuda.max_memory_allocated() / 2**20}
    if peer == "compiled":
        row["decode_compiled"] = getattr(model, "_compiled_call", None) is not None
    return row


def main():
    ap = argparse.ArgumentParser()
    ap.add_argument("--peers", default="hf,compiled")
    ap.add_argument("--batches", default="1,64,256", help="HF generate's batch sizes")
    ap.add_argument("--compiled-batches", default="64,1,256", help="the compiled peer's, in this order")
    ap.add_argument("--prompt", type=int, default=512)
    ap.add_argument("--new", type=int, default=128)
    ap.add_argument("--limit", type=int, default=150, help="seconds for each (peer, batch)")
    args = ap.parse_args()
    cfg = AutoConfig.for_model("qwen2", **QWEN25_05B)
    torch.manual_seed(0)
    with torch.device("cuda"):
        model = AutoModelForCausalLM.from_config(cfg, dtype=torch.bfloat16).eval()
    weight_bytes = sum(p.numel() * p.element_size() for p in model.parameters())

    def on_alarm(signum, frame):
        raise OutOfTime()

    signal.signal(signal.SIGALRM, on_alarm)
    for peer in args.peers.split(","):
        batches = args.batches if peer == "hf" else args.compiled_batches
        for b in [int(x) for x in batches.split(",") if x]:
            row = {"bench": "decode_peer", "peer": peer, "batch": b, "prompt": args.prompt, "new": args.new,
                   "weight_bytes": weight_bytes, "torch": torch.__version__, "gpu": torch.cuda.get_device_name()}
            signal.alarm(args.limit)
            try:
                with torch.no_grad():
                    row.update(run_peer(model, peer, b, args.prompt, args.new))
            except OutOfTime:
                row["error"] = f"over its {args.limit} s limit"
            except Exception as e:  # a transformers or torch without the static-cache path
                row["error"] = f"{type(e).__name__}: {e}"[:2000]
            finally:
                signal.alarm(0)
            torch.cuda.empty_cache()
            print(json.dumps(row), flush=True)


if __name__ == "__main__":
    main()
