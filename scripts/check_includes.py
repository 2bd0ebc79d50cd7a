#!/usr/bin/env python3
"""The module graph, enforced: every #include of an rlx header in src/, include/rlx/,
algorithms/ and envs/ must follow an edge below (docs/ARCHITECTURE.md draws the same graph).

A module is a folder: include/rlx/MODULE/ (its public headers) and src/MODULE/ (its sources and
private headers). A file may include
  - any header of its own module;
  - a public header (rlx/OTHER/...) of a module it depends on, directly or through others;
  - a private header (OTHER/x.hpp, under src/) of another module only where INTERNAL lists it.
algorithms/ and envs/ are plug-ins: public headers only, as a user's own would be.

And calls that must not appear in rlx's C++ (BANNED, tests/ and examples/ included).

  check_includes.py [--graph]     exit 1 naming each include that crosses the graph
"""
import re
import sys
from pathlib import Path

ROOT = Path(__file__).resolve().parent.parent

# module -> the modules it may use directly (its public headers). Keep acyclic.
DEPENDS = {
    "core": [],
    "cuda": ["core"],  # rlx's CUDA kernels, their CPU references and ATen glue
    "chat": ["core"],
    "algo": ["core"],
    "bus": ["core"],
    "model": ["core", "cuda"],
    "env": ["core", "bus", "model"],
    "dist": ["core", "model", "bus"],
    "rollout": ["core", "model", "cuda"],  # the engine
    "learner": ["core", "model", "algo", "dist"],
    "rl": ["core", "model", "algo", "bus", "env", "dist", "rollout", "learner"],  # worker, learner loop
    "serve": ["core", "model", "chat", "rollout"],
    "launch": ["core", "model", "algo", "bus", "env", "dist", "rollout", "learner", "rl", "serve", "cuda"],
    "cli": ["launch"],
}
# Private headers other modules may include: header -> the modules allowed (internal targets).
INTERNAL = {
    "bus/transport.hpp": ["dist", "env"],  # ZeroMQ sockets and frames (target rlx_bus_transport)
    "cuda/ops.hpp": ["model", "rollout"],  # ATen glue of the CUDA kernels (CUDA builds)
    "launch/trainer_commands.hpp": ["cli"],  # the trainer's commands, added to `rlx`
    "core/build_paths.hpp": ["env", "launch"],  # where the build put rlx's executables
}
# Files at include/rlx/ itself (rlx.hpp, version.hpp): the umbrella sees every module.
TOP = "rlx"


def closure():
    out = {}

    def visit(m, seen):
        for d in DEPENDS[m]:
            if d not in seen:
                seen.add(d)
                visit(d, seen)
        return seen

    for m in DEPENDS:
        out[m] = visit(m, set())
        if m in out[m]:
            raise SystemExit(f"check_includes.py: the graph has a cycle through {m}")
    return out


def module_of(path: Path):
    rel = path.relative_to(ROOT).parts
    if rel[0] == "src" and len(rel) > 2:
        return rel[1]
    if rel[:2] == ("include", "rlx"):
        return rel[2] if len(rel) > 3 else TOP
    if rel[0] in ("algorithms", "envs"):
        return "plugin:" + rel[0]
    return None


INCLUDE = re.compile(r'^\s*#\s*include\s*[<"]([^>"]+)[>"]')

# pattern -> why, and what to use instead.
BANNED = {
    re.compile(r"\bremove_all\s*\("): "std::filesystem::remove_all: PyTorch wheels' libtorch.so interposes a copy "
    "that crashed rlx run on the CUDA machine; use rlx::remove_tree (rlx/core/files.hpp)",
}


def banned_calls():
    """Each use of a BANNED call, outside comments."""
    found = []
    for d in ("src", "include/rlx", "algorithms", "envs", "tests", "examples"):
        for path in sorted((ROOT / d).rglob("*")):
            if path.suffix not in (".cpp", ".hpp", ".cu", ".cuh", ".h"):
                continue
            for lineno, line in enumerate(path.read_text(errors="replace").splitlines(), 1):
                code = line.split("//", 1)[0]
                for pattern, why in BANNED.items():
                    if pattern.search(code):
                        found.append(f"{path.relative_to(ROOT)}:{lineno}: {why}")
    return found


def main():
    if "--graph" in sys.argv:
        for m, deps in DEPENDS.items():
            print(f"{m:8} -> {', '.join(deps) if deps else '(nothing)'}")
        return 0
    reach = closure()
    modules = set(DEPENDS)
    bad = []
    files = [p for d in ("src", "include/rlx", "algorithms", "envs") for p in sorted((ROOT / d).rglob("*"))
             if p.suffix in (".cpp", ".hpp", ".cu", ".cuh", ".h")]
    for path in files:
        mod = module_of(path)
        if mod is None:
            continue
        for lineno, line in enumerate(path.read_text(errors="replace").splitlines(), 1):
            m = INCLUDE.match(line)
            if not m:
                continue
            inc = m.group(1)
            parts = inc.split("/")
            where = f"{path.relative_to(ROOT)}:{lineno}: {inc}"
            if parts[0] == "rlx" and len(parts) > 2 and parts[1] in modules:
                target, private = parts[1], False
            elif len(parts) > 1 and parts[0] in modules and (ROOT / "src" / inc).exists():
                target, private = parts[0], True
            else:
                continue  # a system or third-party header, or rlx/rlx.hpp
            if mod == target:
                continue
            if mod == TOP:
                if private:
                    bad.append(f"{where}: a public header includes a private one")
                continue
            if mod.startswith("plugin:"):
                if private:
                    bad.append(f"{where}: {mod[7:]}/ uses public headers only (rlx/...)")
                continue
            if private:
                if mod not in INTERNAL.get(inc, []):
                    bad.append(f"{where}: {target}'s private header (src/{inc}); "
                               f"{mod} may include it only if INTERNAL says so")
                continue
            if target not in reach[mod]:
                bad.append(f"{where}: {mod} does not depend on {target} "
                           f"({mod} -> {', '.join(DEPENDS[mod]) or 'nothing'})")
    for b in bad:
        print(b)
    if bad:
        print(f"FAIL: {len(bad)} include(s) cross the module graph (scripts/check_includes.py)")
        return 1
    banned = banned_calls()
    for b in banned:
        print(b)
    if banned:
        print(f"FAIL: {len(banned)} banned call(s) (scripts/check_includes.py, BANNED)")
        return 1
    print(f"ok: {len(files)} files follow the module graph ({len(DEPENDS)} modules)")
    return 0


if __name__ == "__main__":
    sys.exit(main())
