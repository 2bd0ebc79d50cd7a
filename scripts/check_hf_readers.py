#!/usr/bin/env python3
"""Reads rlx's reward-model and LoRA outputs with the reference libraries (the CUDA image has
transformers, and may have peft; Debian has neither): a sequence classifier written by
`rlx rm` must score token sequences as `rlx model score` does, and `final/adapter` applied to
its base with PEFT and merged must give `final/`'s weights. Prints one JSON line per check;
exits 1 if a check that could run failed.

    check_hf_readers.py --rm DIR --rm-expected FILE [--base DIR --lora-final DIR]
"""
import argparse
import json
import sys


def check_rm(rm_dir, expected_file):
    import torch
    from transformers import AutoModelForSequenceClassification

    expected = json.load(open(expected_file))
    model = AutoModelForSequenceClassification.from_pretrained(rm_dir, torch_dtype=torch.float32).eval()
    worst = 0.0
    with torch.no_grad():
        for ids, want in zip(expected["tokens"], expected["scores"]):  # one at a time: no padding
            got = model(torch.tensor([ids])).logits[0, 0].item()
            worst = max(worst, abs(got - want) / max(1.0, abs(want)))
    ok = worst < 1e-4
    print(json.dumps({"check": "reward_model_transformers", "ok": ok, "worst_relative_difference": worst,
                      "sequences": len(expected["tokens"])}), flush=True)
    return ok


def check_peft(base_dir, final_dir):
    try:
        import peft  # noqa: F401
    except ImportError:
        print(json.dumps({"check": "lora_peft", "ok": None, "skipped": "peft is not installed"}), flush=True)
        return True
    import torch
    from peft import PeftModel
    from safetensors.torch import load_file
    from transformers import AutoModelForCausalLM

    base = AutoModelForCausalLM.from_pretrained(base_dir, torch_dtype=torch.float32)
    merged = PeftModel.from_pretrained(base, f"{final_dir}/adapter").merge_and_unload()
    ours = load_file(f"{final_dir}/model.safetensors")
    theirs = merged.state_dict()
    worst = max((ours[k] - theirs[k]).abs().max().item() for k in ours)
    ok = worst < 1e-5 and set(ours) <= set(theirs)
    print(json.dumps({"check": "lora_peft", "ok": ok, "worst_abs_difference": worst, "tensors": len(ours)}), flush=True)
    return ok


def main():
    p = argparse.ArgumentParser()
    p.add_argument("--rm", required=True)
    p.add_argument("--rm-expected", required=True)
    p.add_argument("--base")
    p.add_argument("--lora-final")
    a = p.parse_args()
    ok = check_rm(a.rm, a.rm_expected)
    if a.base and a.lora_final:
        ok = check_peft(a.base, a.lora_final) and ok
    sys.exit(0 if ok else 1)


if __name__ == "__main__":
    main()
