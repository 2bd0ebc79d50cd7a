#!/usr/bin/env python3
"""The CPU peer of `rlx bench learner`: a plain PyTorch training step in Python (Debian's
python3-torch), same model shape (an rlx preset, Qwen2 layout: q/k/v biases, GQA, RoPE,
RMSNorm, SwiGLU, tied embeddings), same tokens per step, same loss (minus the mean log-prob
of the next token), gradient clipping at 1.0 and AdamW (lr 1e-5), same thread count.
With a mixture-of-experts preset (tiny-moe, small-moe) the model is Qwen3-MoE's: no biases,
q/k RMSNorm, and each layer's MLP a router and experts computed as transformers' eager
Qwen3MoeSparseMoeBlock does (softmax in fp32, top-k renormalised, each expert over the rows
routed to it, index_add back); `rlx bench learner --arch qwen3_moe` is its peer.

  python3 scripts/bench_torch_train_cpu.py --preset tiny --seq 256 --batch-seqs 8 --steps 5 --threads 2

Prints the median step time and tokens/s as one JSON line, last. `rlx bench learner
--ranks 1 --threads 2` with the same --preset/--seq/--batch-seqs is the run it is held against;
with --rlx PATH this script runs both, --pairs times back to back (this machine's speed drifts
between minutes, so each ratio is of a pair), and prints each pair and the median ratio:

  /usr/bin/python3 scripts/bench_torch_train_cpu.py --preset tiny --seq 32 --batch-seqs 32 \
      --steps 31 --rlx build/release/rlx --pairs 8
"""
import argparse, json, math, statistics, subprocess, time

import blas_kernels  # noqa: F401  (the OpenBLAS kernels rlx runs here; may re-execute this script)
import torch
import torch.nn.functional as F

# name: vocab, hidden, intermediate, layers, heads, kv_heads, head_dim (src/model/config.cpp)
PRESETS = {"tiny": (512, 64, 176, 2, 4, 2, 16), "small": (4096, 256, 704, 4, 8, 2, 32),
           "tiny-moe": (512, 64, 176, 2, 4, 2, 16), "small-moe": (4096, 256, 704, 4, 8, 2, 32)}
# name: experts, top-k, expert width
MOE = {"tiny-moe": (8, 2, 64), "small-moe": (16, 4, 176)}


class Mlp(torch.nn.Module):
    def __init__(self, d, inter):
        super().__init__()
        self.gate = torch.nn.Linear(d, inter, bias=False)
        self.up = torch.nn.Linear(d, inter, bias=False)
        self.down = torch.nn.Linear(inter, d, bias=False)

    def forward(self, x):
        return self.down(F.silu(self.gate(x)) * self.up(x))


class Moe(torch.nn.Module):
    def __init__(self, d, experts, top_k, inter):
        super().__init__()
        self.top_k = top_k
        self.router = torch.nn.Linear(d, experts, bias=False)
        self.experts = torch.nn.ModuleList(Mlp(d, inter) for _ in range(experts))

    def forward(self, x):
        shape = x.shape
        x = x.reshape(-1, shape[-1])
        probs = torch.softmax(self.router(x).float(), -1)
        w, idx = probs.topk(self.top_k, -1)
        w = (w / w.sum(-1, keepdim=True)).to(x.dtype)
        out = torch.zeros_like(x)
        mask = F.one_hot(idx, len(self.experts)).permute(2, 1, 0)  # [E, k, N]
        for e in torch.nonzero(mask.sum((-1, -2))).flatten().tolist():
            slot, row = torch.where(mask[e])
            out.index_add_(0, row, self.experts[e](x[row]) * w[row, slot, None])
        return out.reshape(shape)


class Block(torch.nn.Module):
    def __init__(self, d, inter, heads, kv, hd, moe=None):
        super().__init__()
        self.heads, self.kv, self.hd = heads, kv, hd
        self.ln1 = torch.nn.Parameter(torch.ones(d))
        self.ln2 = torch.nn.Parameter(torch.ones(d))
        self.q = torch.nn.Linear(d, heads * hd, bias=moe is None)
        self.k = torch.nn.Linear(d, kv * hd, bias=moe is None)
        self.v = torch.nn.Linear(d, kv * hd, bias=moe is None)
        self.o = torch.nn.Linear(heads * hd, d, bias=False)
        self.qn = torch.nn.Parameter(torch.ones(hd)) if moe else None  # Qwen3's q/k norm
        self.kn = torch.nn.Parameter(torch.ones(hd)) if moe else None
        self.mlp = Moe(d, *moe) if moe else Mlp(d, inter)


def rms(x, w, eps=1e-6):
    return w * (x * torch.rsqrt(x.pow(2).mean(-1, keepdim=True) + eps))


def rope(x, cos, sin):
    a, b = x.chunk(2, -1)
    return x * cos + torch.cat((-b, a), -1) * sin


class Model(torch.nn.Module):
    def __init__(self, vocab, d, inter, layers, heads, kv, hd, moe=None):
        super().__init__()
        self.embed = torch.nn.Parameter(torch.randn(vocab, d) * 0.02)
        self.blocks = torch.nn.ModuleList(Block(d, inter, heads, kv, hd, moe) for _ in range(layers))
        self.norm = torch.nn.Parameter(torch.ones(d))
        for n, p in self.named_parameters():
            if p.dim() == 2:
                torch.nn.init.normal_(p, 0.0, 0.02)
            elif n.endswith("bias"):
                torch.nn.init.zeros_(p)
        self.inv_freq = 1.0 / (10000.0 ** (torch.arange(0, hd, 2).float() / hd))

    def forward(self, tokens):
        B, T = tokens.shape
        freqs = torch.arange(T).float()[:, None] * self.inv_freq[None, :]
        emb = torch.cat((freqs, freqs), -1)
        cos, sin = emb.cos()[None, None], emb.sin()[None, None]
        mask = torch.full((T, T), float("-inf")).triu(1)
        h = F.embedding(tokens, self.embed)
        for blk in self.blocks:
            x = rms(h, blk.ln1)
            q = blk.q(x).view(B, T, blk.heads, blk.hd).transpose(1, 2)
            k = blk.k(x).view(B, T, blk.kv, blk.hd).transpose(1, 2)
            v = blk.v(x).view(B, T, blk.kv, blk.hd).transpose(1, 2)
            if blk.qn is not None:
                q, k = rms(q, blk.qn), rms(k, blk.kn)
            q, k = rope(q, cos, sin), rope(k, cos, sin)
            rep = blk.heads // blk.kv
            k, v = k.repeat_interleave(rep, 1), v.repeat_interleave(rep, 1)
            att = torch.softmax(q @ k.transpose(-1, -2) / math.sqrt(blk.hd) + mask, -1)
            h = h + blk.o((att @ v).transpose(1, 2).reshape(B, T, -1))
            x = rms(h, blk.ln2)
            h = h + blk.mlp(x)
        return rms(h, self.norm) @ self.embed.t()


def torch_run(args):
    torch.manual_seed(0)
    model = Model(*PRESETS[args.preset], MOE.get(args.preset))
    opt = torch.optim.AdamW(model.parameters(), lr=1e-5, betas=(0.9, 0.999), eps=1e-8, weight_decay=0.0)
    g = torch.Generator().manual_seed(1)
    times = []
    for s in range(args.steps + 1):  # step 0 warms up
        tokens = torch.randint(0, PRESETS[args.preset][0], (args.batch_seqs, args.seq), generator=g)
        t0 = time.perf_counter()
        logits = model(tokens)
        logp = torch.log_softmax(logits[:, :-1].float(), -1).gather(-1, tokens[:, 1:, None]).squeeze(-1)
        loss = -logp.sum() / logp.numel()
        loss.backward()
        torch.nn.utils.clip_grad_norm_(model.parameters(), 1.0)
        opt.step()
        opt.zero_grad(set_to_none=True)
        dt = time.perf_counter() - t0
        if s > 0:
            times.append(dt)
    times.sort()
    return times[len(times) // 2], times[0]


def rlx_run(args):
    cmd = [args.rlx, "bench", "learner", "--preset", args.preset, "--seq", str(args.seq), "--batch-seqs",
           str(args.batch_seqs), "--steps", str(args.steps), "--ranks", "1", "--threads", str(args.threads),
           "--arch", "qwen3_moe" if args.preset in MOE else "qwen2"]
    out = subprocess.run(cmd, check=True, capture_output=True, text=True, timeout=3600).stdout
    run = json.loads(out.strip().splitlines()[-1])["runs"][0]
    return run["step_s"], run["step_s_min"]


def main():
    ap = argparse.ArgumentParser()
    ap.add_argument("--preset", default="tiny", choices=sorted(PRESETS))
    ap.add_argument("--seq", type=int, default=256)
    ap.add_argument("--batch-seqs", type=int, default=8)
    ap.add_argument("--steps", type=int, default=5)
    ap.add_argument("--threads", type=int, default=2)
    ap.add_argument("--rlx", help="the rlx binary: also run `rlx bench learner` on the same shape, in pairs")
    ap.add_argument("--pairs", type=int, default=6, help="with --rlx: torch/rlx pairs run back to back")
    args = ap.parse_args()
    torch.set_num_threads(args.threads)
    head = {"preset": args.preset, "torch": torch.__version__, "threads": args.threads, "seq": args.seq,
            "batch_seqs": args.batch_seqs, "steps": args.steps}
    if not args.rlx:
        step_s, step_min = torch_run(args)
        print(json.dumps({"bench": "torch_train_cpu", **head, "step_s": step_s, "step_s_min": step_min,
                          "tokens_per_s": args.batch_seqs * args.seq / step_s}))
        return
    pairs = []
    for i in range(args.pairs):
        t_med, t_min = torch_run(args)
        r_med, r_min = rlx_run(args)
        pairs.append({"torch_step_s": t_med, "rlx_step_s": r_med, "torch_step_s_min": t_min, "rlx_step_s_min": r_min,
                      "speedup": t_med / r_med})
        print(f"pair {i + 1}: torch {1e3 * t_med:.1f} ms, rlx {1e3 * r_med:.1f} ms, rlx speed-up {t_med / r_med:.2f}x",
              flush=True)
    print(json.dumps({"bench": "torch_train_cpu_vs_rlx", **head, "pairs": pairs,
                      "median_speedup": statistics.median(p["speedup"] for p in pairs),
                      "best_step_speedup": min(p["torch_step_s_min"] for p in pairs) /
                                           min(p["rlx_step_s_min"] for p in pairs)}))


if __name__ == "__main__":
    main()
