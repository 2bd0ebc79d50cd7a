#!/usr/bin/env python3
"""The CUDA-only C++ code, checked where there is no GPU: every source (or unity batch of
sources) of a CPU build that has `#if RLX_WITH_CUDA` / `RLX_WITH_NCCL` paths, the sources only
a CUDA build compiles, and the [cuda] test file are compiled syntax-only with both switches on,
against this machine's LibTorch headers and the CUDA toolkit's. Code behind a LibTorch version
check newer than these headers is not seen; everything else that would break the build on a CUDA
machine fails here first.

    scripts/check_cuda_sources.py BUILD_DIR        (ctest runs it: cuda_sources_compile)
"""
import concurrent.futures
import json
import os
import pathlib
import re
import shlex
import subprocess
import sys
import tempfile

ROOT = pathlib.Path(__file__).resolve().parent.parent
SWITCHES = ("RLX_WITH_CUDA", "RLX_WITH_NCCL")


def unity_members(path: pathlib.Path):
    """The sources a unity file (cmake/RlxUnity.cmake) includes, or None for a source of its own."""
    if "/rlx_unity/unity_" not in str(path):
        return None
    return [(path.parent / m).resolve() for m in re.findall(r'^#include "([^"]+)"', path.read_text(), re.M)]


def main() -> int:
    build = pathlib.Path(sys.argv[1]).resolve()
    cuda_include = pathlib.Path(os.environ.get("CUDA_INCLUDE", "/usr/local/cuda/include"))
    if not (cuda_include / "cuda_runtime.h").exists():
        print(f"no CUDA toolkit headers at {cuda_include} (set CUDA_INCLUDE)", file=sys.stderr)
        return 1
    commands = json.loads((build / "compile_commands.json").read_text())
    # Debian's LibTorch ships c10/cuda headers without the one its CMake generates.
    stub = pathlib.Path(tempfile.mkdtemp(prefix="rlx-cuda-stub-"))
    (stub / "c10/cuda/impl").mkdir(parents=True)
    (stub / "c10/cuda/impl/cuda_cmake_macros.h").write_text("#pragma once\n#define C10_CUDA_BUILD_SHARED_LIBS\n")

    jobs = {}
    src_template = test_template = None
    for c in commands:
        path = pathlib.Path(c["file"])
        if "tests/unit/" in str(path) and test_template is None:
            test_template = c
        # A unity batch (src/CMakeLists.txt) is compiled whole, as a CUDA build compiles it: the
        # CUDA paths of its sources side by side, so a name two of them define clashes here too.
        members = unity_members(path)
        if members is None and ROOT / "src" not in path.parents:
            continue
        if "rlx_rollout.dir" in str(path) or path == ROOT / "src/rollout/engine.cpp":
            src_template = c  # a librlx source: the library's flags
        text = "".join(m.read_text(errors="replace") for m in (members or [path]))
        if any(s in text for s in SWITCHES):
            jobs.setdefault(path, c)
    # Sources only a CUDA build compiles (CMakeLists.txt: target_sources under RLX_CUDA_ENABLED),
    # with a library source's flags, and the [cuda] tests with a test's.
    cuda_only = [ROOT / "src/rollout/decode_graphs.cpp", ROOT / "src/rollout/sampling_device.cpp"]
    for path in sorted((ROOT / "src/cuda").glob("*.cpp")) + cuda_only:
        if path not in jobs and src_template is not None:
            jobs[path] = src_template
    if test_template is not None:
        jobs[ROOT / "tests/unit/cuda/cuda_test.cpp"] = test_template
    jobs = list(jobs.items())

    def check(job):
        path, c = job
        args = shlex.split(c["command"])
        out = []
        skip = False
        for i, a in enumerate(args):
            if skip:
                skip = False
                continue
            if a in ("-o", "-include", "-MF", "-MT", "-MQ"):
                skip = True
                continue
            if a == c["file"] or a in ("-c", "-MD", "-MMD", "-Winvalid-pch") or a.endswith(".gch"):
                continue
            for s in SWITCHES:
                if a == f"-D{s}=0":
                    a = f"-D{s}=1"
            out.append(a)
        out += ["-fsyntax-only", f"-I{stub}", f"-I{cuda_include}", f"-I{ROOT / 'src'}", str(path)]
        r = subprocess.run(out, cwd=c["directory"], capture_output=True, text=True)
        return path, r.returncode, r.stderr

    failed = 0
    with concurrent.futures.ThreadPoolExecutor(max_workers=int(os.environ.get("RLX_JOBS", "2"))) as pool:
        for path, rc, err in pool.map(check, jobs):
            rel = path.relative_to(ROOT)
            print(f"{'ok  ' if rc == 0 else 'FAIL'} {rel}")
            if rc != 0:
                failed += 1
                print(err[-6000:])
    print(f"{len(jobs) - failed} of {len(jobs)} sources and unity batches compile with RLX_WITH_CUDA=1 RLX_WITH_NCCL=1")
    return 1 if failed or not jobs else 0


if __name__ == "__main__":
    sys.exit(main())
