#!/usr/bin/env python3
"""The CUDA-only C++ code, checked where there is no GPU: every source (or unity batch of
sources) of a CPU build that has `#if RLX_WITH_CUDA` / `RLX_WITH_NCCL` paths, the sources only
a CUDA build compiles, and the [cuda] test file are compiled with both switches on (-O0, to
objects), against this machine's LibTorch headers and the CUDA toolkit's. Then the link: every
rlx function those objects call must be defined by one of them, by the CUDA kernels' objects
nvcc built here (rlx_cuda_kernels) or by librlx, or a CUDA build would fail to link. Code behind
a LibTorch version check newer than these headers is not seen; everything else that would break
the build on a CUDA machine fails here first.

    scripts/check_cuda_sources.py BUILD_DIR        (ctest runs it: cuda_sources_compile)

A source that passed is not compiled again while its inputs are the same: the compiler (its
path, size and time), the command (this checkout's and build directory's paths made relative)
and the contents of every file the compiler read for it (its `-MD` list). The verdicts, with
the rlx symbols each object defines and calls, are kept under $RLX_CHECK_CACHE (default
~/.cache/rlx/cuda-sources), the way ccache keeps objects, so a fresh clone of unchanged code
passes without compiling; RLX_CHECK_CACHE=off compiles every source.
"""
import concurrent.futures
import hashlib
import json
import os
import pathlib
import re
import shlex
import shutil
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


def rlx_symbols(binary: pathlib.Path, *extra):
    """(defined, undefined): the demangled rlx symbols of an object or library."""
    listing = subprocess.run(["nm", "-C", *extra, str(binary)], capture_output=True, text=True, check=True).stdout
    defined, undefined = set(), set()
    for line in listing.splitlines():
        # "ADDRESS TYPE NAME", or "         U NAME" for an undefined one
        kind, _, name = line[17:].partition(" ") if line[:1] != " " else line.strip().partition(" ")
        if "rlx::" not in name:
            continue
        (undefined if kind == "U" else defined).add(name)
    return defined, undefined


class Verdicts:
    """Passes remembered by their inputs: a job's key (compiler, command, source) names a record
    of the files it read, the hash of their contents when it passed, and its object's rlx
    symbols."""

    def __init__(self, build: pathlib.Path, stub: pathlib.Path):
        where = os.environ.get("RLX_CHECK_CACHE", str(pathlib.Path.home() / ".cache/rlx/cuda-sources"))
        self.dir = None if where == "off" else pathlib.Path(where)
        self.places = [(str(stub), "@STUB"), (str(build), "@BUILD"), (str(ROOT), "@ROOT")]

    def relative(self, text: str) -> str:
        for path, name in self.places:
            text = text.replace(path, name)
        return text

    def absolute(self, text: str) -> str:
        for path, name in self.places:
            text = text.replace(name, path)
        return text

    def key(self, args, path) -> str:
        compiler = pathlib.Path(args[0])
        found = compiler if compiler.is_absolute() else pathlib.Path(shutil.which(args[0]) or args[0])
        st = found.resolve().stat()
        words = [str(found.resolve()), str(st.st_size), str(st.st_mtime_ns)] + [self.relative(a) for a in args]
        return hashlib.sha256("\0".join(words + [self.relative(str(path))]).encode()).hexdigest()

    def contents(self, files) -> str:
        h = hashlib.sha256()
        for f in files:
            h.update(self.relative(f).encode() + b"\0" + pathlib.Path(f).read_bytes())
        return h.hexdigest()

    def passed(self, key: str):
        """The symbols (defined, undefined) of a pass with these inputs, or None."""
        if self.dir is None:
            return None
        try:
            record = json.loads((self.dir / key).read_text())
            if self.contents([self.absolute(f) for f in record["files"]]) == record["hash"]:
                return set(record["defined"]), set(record["undefined"])
        except (OSError, ValueError, KeyError):
            pass  # never checked, a file gone, a torn or older record: compile
        return None

    def remember(self, key: str, depfile: pathlib.Path, directory: str, symbols):
        if self.dir is None:
            return
        # make's syntax: "target: a b \" lines; paths with spaces are escaped "\ " (none here)
        words = depfile.read_text().replace("\\\n", " ").split(":", 1)[1].split()
        files = sorted({str((pathlib.Path(directory) / w).resolve()) for w in words})
        record = {"files": [self.relative(f) for f in files], "hash": self.contents(files),
                  "defined": sorted(symbols[0]), "undefined": sorted(symbols[1])}
        try:
            self.dir.mkdir(parents=True, exist_ok=True)
            tmp = self.dir / f"{key}.{os.getpid()}.tmp"
            tmp.write_text(json.dumps(record))
            tmp.replace(self.dir / key)
        except OSError as e:  # a cache it cannot write: the check is the same, only slower next time
            print(f"(not kept: {e})", file=sys.stderr)


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
    # with a library source's flags, and the [cuda] and kernel tests with a test's.
    cuda_only = [ROOT / "src/rollout/decode_graphs.cpp", ROOT / "src/rollout/sampling_device.cpp"]
    for path in sorted((ROOT / "src/cuda").glob("*.cpp")) + cuda_only:
        if path not in jobs and src_template is not None:
            jobs[path] = src_template
    if test_template is not None:
        jobs[ROOT / "tests/unit/cuda/cuda_test.cpp"] = test_template
        jobs[ROOT / "tests/cuda/kernels_test.cpp"] = test_template  # rlx_cuda_kernel_tests
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
        out += ["-O0", f"-I{stub}", f"-I{cuda_include}", f"-I{ROOT / 'src'}", str(path)]
        key = verdicts.key(out, path)
        symbols = verdicts.passed(key)
        if symbols is not None:
            return path, 0, "", symbols, True
        depfile, obj = stub / f"{key}.d", stub / f"{key}.o"
        r = subprocess.run(out + ["-c", "-o", str(obj), "-MD", "-MF", str(depfile)], cwd=c["directory"],
                           capture_output=True, text=True)
        if r.returncode != 0:
            return path, r.returncode, r.stderr, (set(), set()), False
        symbols = rlx_symbols(obj)
        obj.unlink()
        verdicts.remember(key, depfile, c["directory"], symbols)
        return path, 0, "", symbols, False

    verdicts = Verdicts(build, stub)
    failed = remembered = 0
    defined, undefined = set(), set()
    with concurrent.futures.ThreadPoolExecutor(max_workers=int(os.environ.get("RLX_JOBS", "2"))) as pool:
        for path, rc, err, symbols, cached in pool.map(check, jobs):
            rel = path.relative_to(ROOT) if ROOT in path.parents else path
            print(f"{'ok  ' if rc == 0 else 'FAIL'} {rel}{' (inputs unchanged since it passed)' if cached else ''}")
            remembered += cached
            defined |= symbols[0]
            undefined |= symbols[1]
            if rc != 0:
                failed += 1
                print(err[-6000:])
    print(f"{len(jobs) - failed} of {len(jobs)} sources and unity batches compile with RLX_WITH_CUDA=1 RLX_WITH_NCCL=1"
          f" ({remembered} unchanged since they passed, not compiled again)")
    if failed or not jobs:
        return 1
    return link(build, defined, undefined)


def link(build: pathlib.Path, defined, undefined) -> int:
    """Every rlx symbol the objects call is defined by them, the kernels' objects or librlx."""
    kernels = sorted(build.glob("CMakeFiles/rlx_cuda_kernels.dir/**/*.o"))
    libraries = sorted(p for p in build.glob("librlx.so*") if not p.is_symlink())
    if not kernels or not libraries:
        print(f"the link is not checked: build the CUDA kernels (rlx_cuda_kernels) and librlx in {build} first")
        return 1
    for binary in kernels:
        defined |= rlx_symbols(binary)[0]
    defined |= rlx_symbols(libraries[0], "-D")[0]
    missing = sorted(undefined - defined)
    for name in missing:
        print(f"FAIL undefined in a CUDA build: {name}")
    print(f"the link: {len(undefined)} rlx functions called, {len(missing)} defined nowhere "
          f"({len(kernels)} kernel objects, {libraries[0].name})")
    return 1 if missing else 0


if __name__ == "__main__":
    sys.exit(main())
