#!/usr/bin/env python3
"""Renders the chat-template parity fixtures with Python's jinja2 exactly as Hugging Face
`transformers` does in `apply_chat_template` (an ImmutableSandboxedEnvironment with
trim_blocks, lstrip_blocks and loop controls; its own `tojson`, `raise_exception` and
`strftime_now`; the special tokens of tokenizer_config.json as variables).

  chat_template_reference.py FIXTURE_DIR CONVERSATIONS.json JINJA_CASES.json

Reads FIXTURE_DIR/<model>/tokenizer_config.json for each model directory; writes
FIXTURE_DIR/jinja2.jsonl, one line per (template, case): {"template", "case", "text"} or
{"template", "case", "error"}. Called by scripts/make_chat_template_fixtures.sh.
"""
import json
import os
import sys
from datetime import datetime

import jinja2
from jinja2.sandbox import ImmutableSandboxedEnvironment


def raise_exception(message):
    raise jinja2.exceptions.TemplateError(message)


def tojson(x, ensure_ascii=False, indent=None, separators=None, sort_keys=False):
    # transformers' own tojson: keys keep their order, non-ASCII stays as is.
    return json.dumps(x, ensure_ascii=ensure_ascii, indent=indent, separators=separators, sort_keys=sort_keys)


def strftime_now(fmt):
    return datetime.now().strftime(fmt)


def environment():
    env = ImmutableSandboxedEnvironment(trim_blocks=True, lstrip_blocks=True, extensions=["jinja2.ext.loopcontrols"])
    env.filters["tojson"] = tojson
    env.globals["raise_exception"] = raise_exception
    env.globals["strftime_now"] = strftime_now
    return env


def special_tokens(config):
    """transformers' special_tokens_map: the set ones, AddedToken dicts as their content."""
    out = {}
    for key in ("bos_token", "eos_token", "unk_token", "sep_token", "pad_token", "cls_token", "mask_token"):
        v = config.get(key)
        if isinstance(v, dict):
            v = v.get("content")
        if v is not None:
            out[key] = v
    extra = config.get("additional_special_tokens")
    if extra:
        out["additional_special_tokens"] = [t["content"] if isinstance(t, dict) else t for t in extra]
    return out


def render(env, source, context):
    try:
        return {"text": env.from_string(source).render(**context)}
    except Exception as e:  # the error's kind is what parity checks; messages differ by engine
        return {"error": f"{type(e).__name__}: {e}"}


def main():
    fixture_dir, conversations_file, cases_file = sys.argv[1:4]
    env = environment()
    conversations = json.load(open(conversations_file, encoding="utf-8"))
    lines = []
    for model in sorted(os.listdir(fixture_dir)):
        config_file = os.path.join(fixture_dir, model, "tokenizer_config.json")
        if not os.path.isfile(config_file):
            continue
        config = json.load(open(config_file, encoding="utf-8"))
        source = config["chat_template"]
        for case in conversations["cases"]:
            context = dict(special_tokens(config))
            context.update(messages=case["messages"], add_generation_prompt=case["add_generation_prompt"],
                           tools=conversations["tools"] if case.get("use_tools") else None, documents=None)
            context.update(case.get("kwargs", {}))
            lines.append({"template": model, "case": case["name"], **render(env, source, context)})
    for i, case in enumerate(json.load(open(cases_file, encoding="utf-8"))):
        lines.append({"template": "features", "case": str(i), **render(env, case["template"], case["context"])})
    with open(os.path.join(fixture_dir, "jinja2.jsonl"), "w", encoding="utf-8") as f:
        for line in lines:
            f.write(json.dumps(line, ensure_ascii=False) + "\n")
    print(f"chat template fixtures: {len(lines)} renders with jinja2 {jinja2.__version__}")


if __name__ == "__main__":
    main()
