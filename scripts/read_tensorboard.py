#!/usr/bin/env python3
"""TensorBoard's own reader on rlx's event files (the check issue 38 asks for where the
`tensorboard` package is installed: the CUDA machine's image has it, Debian does not).

  python3 scripts/read_tensorboard.py DIR EXPECTED.jsonl

DIR holds events.out.tfevents.* written by `rlx run` (log.tensorboard); EXPECTED.jsonl is
`rlx inspect tensorboard DIR` of the same files. Every scalar rlx wrote must come back from
TensorBoard's EventAccumulator with the same step and value (float32). Prints a JSON line.
"""
import json, sys

from tensorboard.backend.event_processing.event_accumulator import EventAccumulator

directory, expected_path = sys.argv[1], sys.argv[2]
expected = {}
for line in open(expected_path):
    e = json.loads(line)
    for tag, value in e.get("scalars", {}).items():
        expected[(tag, e["step"])] = value
acc = EventAccumulator(directory, size_guidance={"scalars": 0})
acc.Reload()
tags = acc.Tags()["scalars"]
seen, mismatched = 0, []
for tag in tags:
    for ev in acc.Scalars(tag):
        seen += 1
        want = expected.get((tag, ev.step))
        if want is None or abs(want - ev.value) > 1e-6 * max(1.0, abs(want)):
            mismatched.append((tag, ev.step, ev.value, want))
result = {"bench": "tensorboard_reader", "tags": len(tags), "scalars_read": seen, "scalars_written": len(expected),
          "mismatched": mismatched[:10]}
print(json.dumps(result))
sys.exit(0 if seen == len(expected) and not mismatched else 1)
