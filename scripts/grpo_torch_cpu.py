#!/usr/bin/env python3
"""The CPU peer of `rlx run examples/configs/grpo_arithmetic.yaml`: a plain PyTorch GRPO loop in
one Python process (Debian's python3-torch), on the same model (the SFT warm start's HF
directory: Qwen2 layout, char tokenizer), the same task (one-digit arithmetic, two terms,
"+-*", the environment's prompt format and reward: the last integer of the answer equals the
value), the same samples (16 groups of 8 per step, up to 4 new tokens, temperature 1, the
answer's newline ends a sample) and the same update (GRPO: group mean/std advantages, the
token-mean policy-gradient loss, entropy measured, gradients clipped at 1.0, AdamW at 3e-4).
Generation is what a careful PyTorch user writes: each prompt prefilled once into a KV cache
shared by its 8 samples, then batched decode steps with the cache.

  /usr/bin/python3 scripts/grpo_torch_cpu.py --model runs/sft_arithmetic/final --steps 40 --threads 2

Prints the median seconds per step after --warmup steps as one JSON line, last. With --rlx
PATH it also runs `rlx run` on examples/configs/grpo_arithmetic.yaml (placement colocated and
split, mode sync and async, the same --steps), back to back with this loop, and prints each
one's steady seconds per step (the median gap between metrics lines after --warmup) and its
speed-up over this loop:

  /usr/bin/python3 scripts/grpo_torch_cpu.py --model runs/sft_arithmetic/final --steps 40 \\
      --rlx build/release/rlx --rounds 2
"""
import argparse, json, math, os, random, re, shutil, statistics, struct, subprocess, tempfile, time

import blas_kernels  # noqa: F401  (the OpenBLAS kernels rlx runs here; may re-execute this script)
import torch
import torch.nn.functional as F

DTYPES = {"F32": torch.float32, "BF16": torch.bfloat16, "F16": torch.float16}


def load_safetensors(path):
    with open(path, "rb") as f:
        n = struct.unpack("<Q", f.read(8))[0]
        header = json.loads(f.read(n))
        data = bytearray(f.read())
    out = {}
    for name, h in header.items():
        if name == "__metadata__":
            continue
        a, b = h["data_offsets"]
        t = torch.frombuffer(data[a:b], dtype=DTYPES[h["dtype"]]).reshape(h["shape"]).clone() if b > a else \
            torch.zeros(h["shape"], dtype=DTYPES[h["dtype"]])
        out[name] = t.float()
    return out


def rms(x, w, eps):
    return w * (x * torch.rsqrt(x.pow(2).mean(-1, keepdim=True) + eps))


def rope(x, cos, sin):
    a, b = x.chunk(2, -1)
    return x * cos + torch.cat((-b, a), -1) * sin


class Qwen2(torch.nn.Module):
    """The HF Qwen2 layout, as rlx loads it (q/k/v biases, GQA, RoPE, RMSNorm, SwiGLU, tied head)."""

    def __init__(self, model_dir):
        super().__init__()
        c = json.load(open(os.path.join(model_dir, "config.json")))
        self.h, self.kv = c["num_attention_heads"], c["num_key_value_heads"]
        self.d = c["hidden_size"] // self.h if "head_dim" not in c else c["head_dim"]
        self.eps, self.layers = c.get("rms_norm_eps", 1e-6), c["num_hidden_layers"]
        w = load_safetensors(os.path.join(model_dir, "model.safetensors"))
        self.params = torch.nn.ParameterDict({k.replace(".", "__"): torch.nn.Parameter(v) for k, v in w.items()})
        self.tied = "lm_head.weight" not in w
        theta = c.get("rope_theta", 10000.0)
        self.inv_freq = 1.0 / (theta ** (torch.arange(0, self.d, 2).float() / self.d))

    def p(self, name):
        return self.params[name.replace(".", "__")]

    def rotary(self, positions):
        f = positions.float()[:, None] * self.inv_freq[None, :]
        e = torch.cat((f, f), -1)
        return e.cos()[None, None], e.sin()[None, None]

    def forward(self, tokens, start=0, cache=None):
        """tokens [B, T] at positions start.. ; cache: per layer (k, v) [B, kv, S, d], extended in place."""
        B, T = tokens.shape
        cos, sin = self.rotary(torch.arange(start, start + T))
        h = F.embedding(tokens, self.p("model.embed_tokens.weight"))
        mask = torch.full((T, start + T), float("-inf")).triu(start + 1) if T > 1 else None
        for i in range(self.layers):
            pre = f"model.layers.{i}."
            x = rms(h, self.p(pre + "input_layernorm.weight"), self.eps)
            q = F.linear(x, self.p(pre + "self_attn.q_proj.weight"), self.p(pre + "self_attn.q_proj.bias"))
            k = F.linear(x, self.p(pre + "self_attn.k_proj.weight"), self.p(pre + "self_attn.k_proj.bias"))
            v = F.linear(x, self.p(pre + "self_attn.v_proj.weight"), self.p(pre + "self_attn.v_proj.bias"))
            q = rope(q.view(B, T, self.h, self.d).transpose(1, 2), cos, sin)
            k = rope(k.view(B, T, self.kv, self.d).transpose(1, 2), cos, sin)
            v = v.view(B, T, self.kv, self.d).transpose(1, 2)
            if cache is not None:
                if len(cache) > i:
                    k, v = torch.cat((cache[i][0], k), 2), torch.cat((cache[i][1], v), 2)
                    cache[i] = (k, v)
                else:
                    cache.append((k, v))
            rep = self.h // self.kv
            kr, vr = k.repeat_interleave(rep, 1), v.repeat_interleave(rep, 1)
            att = q @ kr.transpose(-1, -2) / math.sqrt(self.d)
            if mask is not None:
                att = att + mask
            h = h + F.linear((torch.softmax(att, -1) @ vr).transpose(1, 2).reshape(B, T, -1),
                             self.p(pre + "self_attn.o_proj.weight"))
            x = rms(h, self.p(pre + "post_attention_layernorm.weight"), self.eps)
            h = h + F.linear(F.silu(F.linear(x, self.p(pre + "mlp.gate_proj.weight"))) *
                             F.linear(x, self.p(pre + "mlp.up_proj.weight")), self.p(pre + "mlp.down_proj.weight"))
        head = self.p("model.embed_tokens.weight") if self.tied else self.p("lm_head.weight")
        return F.linear(rms(h, self.p("model.norm.weight"), self.eps), head)


class CharTokenizer:
    def __init__(self, path):
        t = json.load(open(path))
        assert t.get("type") == "char", "this peer reads rlx's char tokenizer"
        self.tokens = list(t.get("special_tokens", [])) + list(t["alphabet"])
        self.ids = {s: i for i, s in enumerate(self.tokens)}

    def encode(self, s):
        return [self.ids[c] for c in s]

    def decode(self, ids):
        return "".join(self.tokens[i] for i in ids)


def task(rng):
    a, b, op = rng.randint(0, 9), rng.randint(0, 9), rng.choice("+-*")
    return f"Compute {a} {op} {b}. Give the final answer as a number.\n", eval(f"{a} {op} {b}")


def reward(text, answer):
    found = re.findall(r"-?\d+", text)
    return 1.0 if found and int(found[-1]) == answer else 0.0


def grpo_loop(args):
    torch.manual_seed(args.seed)
    rng = random.Random(args.seed)
    model = Qwen2(args.model)
    tok = CharTokenizer(os.path.join(args.model, "tokenizer.json"))
    newline = tok.ids["\n"]
    opt = torch.optim.AdamW(model.parameters(), lr=args.lr, betas=(0.9, 0.999), eps=1e-8, weight_decay=0.0)
    G, N = args.groups, args.group_size
    times, gen_times, rewards = [], [], []
    for step in range(args.steps):
        t0 = time.perf_counter()
        tasks = [task(rng) for _ in range(G)]
        prompts = [tok.encode(p) for p, _ in tasks]
        L = max(len(p) for p in prompts)
        assert all(len(p) == L for p in prompts), "one-digit prompts are all of one length"
        # Generation: each prompt once into the cache, its 8 samples sharing it; batched decode.
        with torch.no_grad():
            cache = []
            logits = model(torch.tensor(prompts), 0, cache)[:, -1]
            cache = [(k.repeat_interleave(N, 0), v.repeat_interleave(N, 0)) for k, v in cache]
            logits = logits.repeat_interleave(N, 0)
            gen = torch.zeros(G * N, 0, dtype=torch.long)
            done = torch.zeros(G * N, dtype=torch.bool)
            lengths = torch.full((G * N,), args.max_new_tokens)
            for t in range(args.max_new_tokens):
                probs = torch.softmax(logits / args.temperature, -1)
                nxt = torch.multinomial(probs, 1).squeeze(1)
                gen = torch.cat((gen, nxt[:, None]), 1)
                ended = (nxt == newline) & ~done
                lengths[ended] = t + 1
                done |= ended
                if bool(done.all()) or t + 1 == args.max_new_tokens:
                    break
                logits = model(nxt[:, None], L + t, cache)[:, -1]
        t_gen = time.perf_counter() - t0
        # Rewards, and GRPO's advantages over each group.
        r = torch.tensor([reward(tok.decode(gen[i, :lengths[i]].tolist()), tasks[i // N][1]) for i in range(G * N)])
        g = r.view(G, N)
        adv = ((g - g.mean(1, keepdim=True)) / (g.std(1, keepdim=True) + 1e-6)).view(-1)
        # The update: log-probs of the sampled tokens under the current weights (on-policy,
        # one pass), the token-mean loss, entropy measured.
        seqs = torch.cat((torch.tensor(prompts).repeat_interleave(N, 0), gen), 1)
        T = seqs.shape[1]
        mask = (torch.arange(gen.shape[1])[None, :] < lengths[:, None]).float()
        logits = model(seqs[:, :-1])[:, L - 1:]
        logp_all = torch.log_softmax(logits.float(), -1)
        logp = logp_all.gather(-1, gen[:, :, None]).squeeze(-1)
        ratio = torch.exp(logp - logp.detach())
        loss = -(adv[:, None] * ratio * mask).sum() / mask.sum()
        with torch.no_grad():
            entropy = (-(logp_all.exp() * logp_all).sum(-1) * mask).sum() / mask.sum()
        loss.backward()
        torch.nn.utils.clip_grad_norm_(model.parameters(), 1.0)
        opt.step()
        opt.zero_grad(set_to_none=True)
        times.append(time.perf_counter() - t0)
        gen_times.append(t_gen)
        rewards.append(float(r.mean()))
        _ = (T, float(entropy))
    steady = times[args.warmup:]
    return {"step_s": statistics.median(steady), "step_s_min": min(steady),
            "generate_s": statistics.median(gen_times[args.warmup:]),
            "train_s": statistics.median(t - g for t, g in zip(times[args.warmup:], gen_times[args.warmup:])),
            "reward_first": rewards[0],
            "reward_last10": statistics.mean(rewards[-10:])}


def rlx_run(args, placement, mode, work):
    """One `rlx run` of the example config; its steady seconds per step from metrics.jsonl."""
    here = os.path.dirname(os.path.abspath(__file__))
    config = os.path.join(here, "..", "examples", "configs", "grpo_arithmetic.yaml")
    name = f"{placement}_{mode}"
    cmd = [args.rlx, "run", config, f"run.name={name}", f"run.out_dir={work}", f"model.path={os.path.abspath(args.model)}",
           f"train.steps={args.steps}", f"train.placement={placement}", f"train.mode={mode}", "run.plots=false",
           "learner.checkpoint_every=0", "--force"]
    subprocess.run(cmd, check=True, capture_output=True, text=True, timeout=3600)
    m = [json.loads(l) for l in open(os.path.join(work, name, "metrics.jsonl"))]
    t = [x["time_s"] for x in m]
    gaps = [b - a for a, b in zip(t[args.warmup:], t[args.warmup + 1:])]
    keys = ("generate_s", "train_s", "sync_s", "wait_s", "busy_device", "busy_learner", "busy_rollout")
    phases = {k: statistics.median(x[k] for x in m[args.warmup:]) for k in keys if all(k in x for x in m[args.warmup:])}
    return {"placement": placement, "mode": mode, "step_s": statistics.median(gaps), "step_s_min": min(gaps),
            "reward_last10": statistics.mean(x.get("reward_mean", 0) for x in m[-10:]), **phases}


def main():
    ap = argparse.ArgumentParser()
    ap.add_argument("--model", required=True, help="the SFT warm start (runs/sft_arithmetic/final)")
    ap.add_argument("--steps", type=int, default=40)
    ap.add_argument("--warmup", type=int, default=5)
    ap.add_argument("--groups", type=int, default=16)
    ap.add_argument("--group-size", type=int, default=8)
    ap.add_argument("--max-new-tokens", type=int, default=4)
    ap.add_argument("--temperature", type=float, default=1.0)
    ap.add_argument("--lr", type=float, default=3e-4)
    ap.add_argument("--threads", type=int, default=2)
    ap.add_argument("--seed", type=int, default=0)
    ap.add_argument("--rlx", help="the rlx binary: also time `rlx run` of the example, colocated and split, sync and async")
    ap.add_argument("--rounds", type=int, default=1, help="with --rlx: rounds of (this loop, the four rlx runs)")
    args = ap.parse_args()
    torch.set_num_threads(args.threads)
    head = {"torch": torch.__version__, "threads": args.threads, "steps": args.steps, "warmup": args.warmup,
            "groups": args.groups, "group_size": args.group_size, "max_new_tokens": args.max_new_tokens}
    if not args.rlx:
        print(json.dumps({"bench": "grpo_torch_cpu", **head, **grpo_loop(args)}))
        return
    rounds = []
    work = tempfile.mkdtemp(prefix="rlx-grpo-bench-")
    try:
        for i in range(args.rounds):
            peer = grpo_loop(args)
            runs = []
            for placement in ("colocated", "split"):
                for mode in ("sync", "async"):
                    r = rlx_run(args, placement, mode, work)
                    r["speedup"] = peer["step_s"] / r["step_s"]
                    runs.append(r)
                    print(f"round {i + 1}: {placement}/{mode}: rlx {1e3 * r['step_s']:.1f} ms/step, torch "
                          f"{1e3 * peer['step_s']:.1f} ms/step, speed-up {r['speedup']:.2f}x", flush=True)
            rounds.append({"torch": peer, "rlx": runs})
    finally:
        shutil.rmtree(work, ignore_errors=True)
    print(json.dumps({"bench": "grpo_torch_cpu_vs_rlx", **head, "rounds": rounds}))


if __name__ == "__main__":
    main()
