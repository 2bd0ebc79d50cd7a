#!/usr/bin/env python3
"""Code problems with stdin/stdout (or call-based) tests as rlx `python_code` task lines.

Two uses:

  # APPS / TACO-style JSONL (fields question, solutions, input_output[, starter_code,
  # time_limit, url]) -> rlx lines; a bad line is named (file:line and field) and stops the
  # conversion unless --skip-bad.
  scripts/make_code_dataset.py convert apps_train.jsonl -o code_train.jsonl [--max-cases 16]
      [--with-solution] [--skip-bad]

  # the small set shipped in examples/data (10 problems written for rlx, each with a
  # reference solution that this script runs on every case before writing).
  scripts/make_code_dataset.py example [--out-dir examples/data]

An rlx line: {"prompt": ..., "input_output": {"inputs": [...], "outputs": [...], "fn_name"?},
"time_limit_s"?, "source"?}; with --with-solution (and in the example's *_reference.jsonl)
also "response": a reference solution in a ```python block, which `rlx env score
python_code --input FILE` grades (every reference should score 1).
"""
import argparse
import json
import os
import re
import subprocess
import sys

STDIN_INSTRUCTION = ("Read the input from standard input and write the answer to standard output. "
                     "Write your solution in Python 3 in a ```python code block.")
CALL_INSTRUCTION = "Complete the function `{fn}` in Python 3 and give the whole code in a ```python code block."


class BadLine(Exception):
    pass


def make_prompt(question, fn_name=None, starter_code=""):
    if fn_name:
        text = question.rstrip() + "\n\n" + CALL_INSTRUCTION.format(fn=fn_name)
        if starter_code and starter_code.strip():
            text += "\n\n```python\n" + starter_code.rstrip() + "\n```"
        return text
    return question.rstrip() + "\n\n" + STDIN_INSTRUCTION


def parse_time_limit(value):
    """TACO writes "2 seconds", "1.5 s", or a number."""
    if value is None or value == "":
        return None
    if isinstance(value, (int, float)):
        return float(value) if value > 0 else None
    m = re.match(r"\s*([0-9]*\.?[0-9]+)", str(value))
    return float(m.group(1)) if m and float(m.group(1)) > 0 else None


def read_tests(io, where):
    if isinstance(io, str):
        try:
            io = json.loads(io)
        except json.JSONDecodeError as e:
            raise BadLine(f"{where}: field 'input_output': not JSON ({e})")
    if not isinstance(io, dict):
        raise BadLine(f"{where}: field 'input_output': expected an object, got {type(io).__name__}")
    for key in ("inputs", "outputs"):
        if key not in io:
            raise BadLine(f"{where}: field 'input_output.{key}' is missing")
        if not isinstance(io[key], list):
            raise BadLine(f"{where}: field 'input_output.{key}': expected a list")
    if len(io["inputs"]) != len(io["outputs"]):
        raise BadLine(f"{where}: field 'input_output.outputs': {len(io['outputs'])} outputs for {len(io['inputs'])} inputs")
    if not io["inputs"]:
        raise BadLine(f"{where}: field 'input_output.inputs': no test cases")
    fn = io.get("fn_name")
    if fn is not None and not (isinstance(fn, str) and fn.isidentifier()):
        raise BadLine(f"{where}: field 'input_output.fn_name': {fn!r} is not a function name")
    if fn is None:
        for i, (x, y) in enumerate(zip(io["inputs"], io["outputs"])):
            for name, v in (("inputs", x), ("outputs", y)):
                if not (isinstance(v, str) or (isinstance(v, list) and all(isinstance(s, str) for s in v))):
                    raise BadLine(f"{where}: field 'input_output.{name}[{i}]': expected text (stdin/stdout tests)")
    return io


def convert_line(src, where, max_cases, with_solution):
    if not isinstance(src, dict):
        raise BadLine(f"{where}: expected a JSON object")
    question = src.get("question", src.get("prompt"))
    if not isinstance(question, str) or not question.strip():
        raise BadLine(f"{where}: field 'question' is missing or empty")
    if "input_output" not in src:
        raise BadLine(f"{where}: field 'input_output' is missing")
    io = read_tests(src["input_output"], where)
    out_io = {"inputs": io["inputs"][:max_cases], "outputs": io["outputs"][:max_cases]}
    if io.get("fn_name"):
        out_io["fn_name"] = io["fn_name"]
    line = {"prompt": make_prompt(question, io.get("fn_name"), src.get("starter_code") or ""), "input_output": out_io}
    tl = parse_time_limit(src.get("time_limit"))
    if tl:
        line["time_limit_s"] = tl
    if src.get("url") or src.get("id") is not None:
        line["source"] = src.get("url") or str(src.get("id"))
    if with_solution:
        solutions = src.get("solutions")
        if isinstance(solutions, str):
            try:
                solutions = json.loads(solutions) if solutions.strip() else []
            except json.JSONDecodeError as e:
                raise BadLine(f"{where}: field 'solutions': not JSON ({e})")
        if solutions:
            if not isinstance(solutions, list) or not isinstance(solutions[0], str):
                raise BadLine(f"{where}: field 'solutions': expected a list of programs")
            line["response"] = "```python\n" + solutions[0].rstrip() + "\n```"
    return line


def convert(args):
    converted = bad = 0
    out = open(args.output, "w") if args.output != "-" else sys.stdout
    with open(args.input) as f:
        for lineno, text in enumerate(f, 1):
            if not text.strip():
                continue
            where = f"{args.input}:{lineno}"
            try:
                try:
                    src = json.loads(text)
                except json.JSONDecodeError as e:
                    raise BadLine(f"{where}: not JSON ({e})")
                line = convert_line(src, where, args.max_cases, args.with_solution)
            except BadLine as e:
                bad += 1
                print(e, file=sys.stderr)
                if not args.skip_bad:
                    return 1
                continue
            out.write(json.dumps(line) + "\n")
            converted += 1
    if out is not sys.stdout:
        out.close()
    print(f"converted {converted} problems, skipped {bad} bad lines", file=sys.stderr)
    return 0


# --- the shipped example set ---------------------------------------------------------

def cases(*pairs):
    return {"inputs": [p[0] for p in pairs], "outputs": [p[1] for p in pairs]}


EXAMPLES = [
    dict(question="Given two integers a and b on one line, print a + b.",
         tests=cases(("1 2\n", "3\n"), ("-5 5\n", "0\n"), ("1000000000000 999999999999\n", "1999999999999\n"),
                     ("0 0\n", "0\n")),
         solution="a, b = map(int, input().split())\nprint(a + b)\n"),
    dict(question="A line of words separated by single spaces is given. Print the words in reverse order, "
                  "separated by single spaces.",
         tests=cases(("hello world\n", "world hello\n"), ("one\n", "one\n"), ("a b c d e\n", "e d c b a\n")),
         solution="print(' '.join(input().split()[::-1]))\n"),
    dict(question="Given n (1 <= n <= 200000), print how many prime numbers are less than or equal to n.",
         tests=cases(("10\n", "4\n"), ("1\n", "0\n"), ("2\n", "1\n"), ("100\n", "25\n"), ("200000\n", "17984\n")),
         solution=("n = int(input())\nsieve = bytearray([1]) * (n + 1)\nsieve[0:2] = b'\\x00\\x00'[:min(2, n + 1)]\n"
                   "i = 2\nwhile i * i <= n:\n    if sieve[i]:\n        sieve[i * i::i] = bytearray(len(range(i * i, n + 1, i)))\n"
                   "    i += 1\nprint(sum(sieve))\n")),
    dict(question="The first line holds n (1 <= n <= 100000), the second n integers. Print the largest sum of a "
                  "non-empty run of consecutive integers.",
         tests=cases(("5\n1 -2 3 4 -1\n", "7\n"), ("3\n-3 -1 -2\n", "-1\n"), ("1\n5\n", "5\n"),
                     ("8\n-2 1 -3 4 -1 2 1 -5\n", "6\n")),
         solution=("input()\nbest = cur = None\nfor x in map(int, input().split()):\n"
                   "    cur = x if cur is None or cur < 0 else cur + x\n    best = cur if best is None else max(best, cur)\n"
                   "print(best)\n")),
    dict(question="Given n (0 <= n <= 100000), print the n-th Fibonacci number modulo 1000000007 "
                  "(F(0) = 0, F(1) = 1).",
         tests=cases(("0\n", "0\n"), ("1\n", "1\n"), ("10\n", "55\n"), ("100\n", "687995182\n")),
         solution="n = int(input())\na, b = 0, 1\nfor _ in range(n):\n    a, b = b, (a + b) % 1000000007\nprint(a)\n"),
    dict(question="The first line holds t; each of the next t lines holds a word of lowercase letters. For each "
                  "word print YES if it reads the same backwards, else NO.",
         tests=cases(("3\nabba\nabc\na\n", "YES\nNO\nYES\n"), ("1\nracecar\n", "YES\n"), ("2\nab\naa\n", "NO\nYES\n")),
         solution="for _ in range(int(input())):\n    w = input().strip()\n    print('YES' if w == w[::-1] else 'NO')\n"),
    dict(question="Given two positive integers a and b, print their greatest common divisor and least common "
                  "multiple, separated by a space.",
         tests=cases(("12 18\n", "6 36\n"), ("7 13\n", "1 91\n"), ("100 100\n", "100 100\n"),
                     ("123456789 987654321\n", "9 13548070123626141\n")),
         solution="import math\na, b = map(int, input().split())\ng = math.gcd(a, b)\nprint(g, a // g * b)\n"),
    dict(question="The first line holds n; the next n lines hold names. Print the names sorted by length, and "
                  "names of equal length alphabetically, one per line.",
         tests=cases(("4\nbob\nalice\neve\nzed\n", "bob\neve\nzed\nalice\n"), ("1\nx\n", "x\n"),
                     ("3\ncc\nb\naaa\n", "b\ncc\naaa\n")),
         solution="names = [input().strip() for _ in range(int(input()))]\nprint('\\n'.join(sorted(names, key=lambda s: (len(s), s))))\n"),
    dict(question="Write a function two_sum(nums, target) returning the indices [i, j] (i < j) of the two numbers "
                  "of the list nums that add up to target. Exactly one such pair exists.",
         tests={"fn_name": "two_sum", "inputs": [[[2, 7, 11, 15], 9], [[3, 2, 4], 6], [[1, 5, 5, 3], 10]],
                "outputs": [[[0, 1]], [[1, 2]], [[1, 2]]]},
         solution=("def two_sum(nums, target):\n    seen = {}\n    for j, x in enumerate(nums):\n"
                   "        if target - x in seen:\n            return [seen[target - x], j]\n        seen[x] = j\n"),
         starter_code="def two_sum(nums, target):\n    "),
    dict(question="Write a function is_anagram(a, b) returning True when the strings a and b hold the same letters "
                  "the same number of times, ignoring case.",
         tests={"fn_name": "is_anagram", "inputs": [["Listen", "Silent"], ["abc", "abd"], ["", ""], ["aab", "ab"]],
                "outputs": [[True], [False], [True], [False]]},
         solution="def is_anagram(a, b):\n    return sorted(a.lower()) == sorted(b.lower())\n",
         starter_code="def is_anagram(a, b):\n    "),
]


def normalise(text):
    lines = [line.rstrip() for line in text.replace("\r\n", "\n").split("\n")]
    while lines and not lines[-1]:
        lines.pop()
    return lines


def check_reference(p):
    """Runs the reference solution on every case (outside any sandbox: it is our own code)."""
    io = p["tests"]
    for i, (x, y) in enumerate(zip(io["inputs"], io["outputs"])):
        if "fn_name" in io:
            ns = {}
            exec(p["solution"], ns)
            got = ns[io["fn_name"]](*x)
            ok = got == y or [got] == y
        else:
            r = subprocess.run([sys.executable, "-c", p["solution"]], input=x, capture_output=True, text=True, timeout=30)
            ok = r.returncode == 0 and normalise(r.stdout) == normalise(y)
            got = r.stdout + r.stderr
        if not ok:
            raise SystemExit(f"example {p['question'][:40]!r}: case {i}: reference gave {got!r}, expected {y!r}")


def example(args):
    os.makedirs(args.out_dir, exist_ok=True)
    tasks = os.path.join(args.out_dir, "code_stdio.jsonl")
    refs = os.path.join(args.out_dir, "code_stdio_reference.jsonl")
    with open(tasks, "w") as ft, open(refs, "w") as fr:
        for p in EXAMPLES:
            check_reference(p)
            line = {"prompt": make_prompt(p["question"], p["tests"].get("fn_name"), p.get("starter_code", "")),
                    "input_output": p["tests"]}
            ft.write(json.dumps(line) + "\n")
            fr.write(json.dumps(dict(line, response="```python\n" + p["solution"] + "```")) + "\n")
    print(f"wrote {len(EXAMPLES)} problems to {tasks} and their reference solutions to {refs}", file=sys.stderr)
    return 0


def main():
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    sub = ap.add_subparsers(dest="cmd", required=True)
    c = sub.add_parser("convert", help="APPS/TACO-style JSONL to rlx python_code lines")
    c.add_argument("input")
    c.add_argument("-o", "--output", default="-")
    c.add_argument("--max-cases", type=int, default=64, help="test cases kept per problem (the first N)")
    c.add_argument("--with-solution", action="store_true", help="add the first reference solution as \"response\"")
    c.add_argument("--skip-bad", action="store_true", help="skip a bad line (named on stderr) instead of stopping")
    e = sub.add_parser("example", help="write the shipped example set")
    e.add_argument("--out-dir", default=os.path.join(os.path.dirname(os.path.abspath(__file__)), "..", "examples", "data"))
    args = ap.parse_args()
    return convert(args) if args.cmd == "convert" else example(args)


if __name__ == "__main__":
    sys.exit(main())
