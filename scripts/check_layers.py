#!/usr/bin/env python3
"""Check that the sources' includes read top to bottom (docs/architecture.md "Layers").

Every `#include "..."` of a file in src/, tools/ and python/flexjit_ext.cpp is resolved the way
the compiler resolves it (the including file's folder, then src/, tools/, include/, templates/).
A file's room is its folder (src/ir, src/kernels/forward, tools/flexjit; src itself for
src/Pipeline.{h,cpp}). The public headers (include/flexjit/) are the API and the device ABI
(templates/) is shared with the kernels: both may be included from everywhere and are not
rooms. Each room sits on one floor of FLOORS below, lowest first; a file may include its own
room and the rooms of lower floors. An include of a higher floor runs back up; one of another
room on the same floor is sideways, allowed only for the pairs listed in SIDEWAYS.

Prints the floors, every include that runs back up or sideways (file:line -> target) and every
cycle between rooms (a circle of room-to-room includes, whatever the floors say), and exits 1 if
there is any, or a room that has no floor, or an include that resolves to no file.

Usage: scripts/check_layers.py [--root DIR]
"""

import argparse
import collections
import os
import re
import sys
from pathlib import Path

# The floors, lowest first. A room includes its own floor's rooms only through SIDEWAYS.
FLOORS = [
    ("utilities", ["src/util"]),
    ("IR, device primitives, compiler", ["src/ir", "src/device", "src/jit"]),
    ("passes, DSL, binding and validation", ["src/passes", "src/dsl", "src/binding"]),
    ("code generation", ["src/codegen/cuda", "src/codegen/llvm"]),
    ("kernel model, CPU backend", ["src/kernels", "src/cpu"]),
    ("companion kernels (no mods: built beside the variants that launch them)",
     ["src/kernels/forward_companions"]),
    ("forward family, block-mask family", ["src/kernels/forward", "src/kernels/block_mask"]),
    ("families built on the forward, context-parallel sharding",
     ["src/kernels/backward", "src/kernels/decode", "src/cp"]),
    ("built-in variants, compiler pipeline", ["src/kernels/builtins", "src"]),
    ("context and plans", ["src/plan"]),
    ("tuning", ["src/tune"]),
    ("entry points", ["src/runtime"]),
    ("CLI, Python module", ["tools/flexjit", "python"]),
]

# (from room, to room) pairs on one floor that may include each other's headers. None today.
SIDEWAYS = set()

SCANNED = ("src", "tools")
SCANNED_FILES = ("python/flexjit_ext.cpp",)
SEARCH_DIRS = ("src", "tools", "include", "templates")
NOT_ROOMS = ("include", "templates")  # the public API and the device ABI: open to everyone
SUFFIXES = {".h", ".hpp", ".cpp", ".cc"}
INCLUDE_RE = re.compile(r'^\s*#\s*include\s*"([^"]+)"')


def sources(root):
    for top in SCANNED:
        for p in sorted((root / top).rglob("*")):
            if p.suffix in SUFFIXES and p.is_file():
                yield p.relative_to(root)
    for f in SCANNED_FILES:
        if (root / f).is_file():
            yield Path(f)


def resolve(root, src, target):
    """The repository path `#include "target"` in `src` names, or None."""
    for base in [src.parent] + [Path(d) for d in SEARCH_DIRS]:
        cand = Path(os.path.normpath(base / target))
        if (root / cand).is_file():
            return cand
    return None


def room_of(path):
    return path.parent.as_posix()


def cycles(edges):
    """Strongly connected sets of more than one room (Tarjan), each as a sorted list."""
    graph = collections.defaultdict(set)
    for a, b in edges:
        graph[a].add(b)
    index, low, stack, on_stack, out = {}, {}, [], set(), []

    def visit(v):
        index[v] = low[v] = len(index)
        stack.append(v)
        on_stack.add(v)
        for w in sorted(graph[v]):
            if w not in index:
                visit(w)
                low[v] = min(low[v], low[w])
            elif w in on_stack:
                low[v] = min(low[v], index[w])
        if low[v] == index[v]:
            comp = []
            while True:
                w = stack.pop()
                on_stack.discard(w)
                comp.append(w)
                if w == v:
                    break
            if len(comp) > 1:
                out.append(sorted(comp))

    for v in sorted(set(graph) | {b for bs in graph.values() for b in bs}):
        if v not in index:
            visit(v)
    return out


def path_between(start, goal, edges, inside):
    """The shortest chain of room includes from `start` to `goal` within `inside`, or None."""
    graph = collections.defaultdict(list)
    for a, b in sorted(edges):
        if a in inside and b in inside:
            graph[a].append(b)
    prev, queue = {start: None}, collections.deque([start])
    while queue:
        v = queue.popleft()
        if v == goal:
            path = [v]
            while prev[path[-1]] is not None:
                path.append(prev[path[-1]])
            return list(reversed(path))
        for w in graph[v]:
            if w not in prev:
                prev[w] = v
                queue.append(w)
    return None


def main():
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--root", default=Path(__file__).resolve().parent.parent, type=Path)
    args = ap.parse_args()
    root = args.root

    floor_of, names = {}, {}
    for i, (name, rooms) in enumerate(FLOORS, 1):
        for r in rooms:
            floor_of[r] = i
        names[i] = name

    problems = 0
    up, sideways, unplaced, unresolved = [], [], set(), []
    edges = collections.defaultdict(list)  # (room, room) -> ["file:line -> target", ...]
    for src in sources(root):
        here = room_of(src)
        if here not in floor_of:
            unplaced.add(here)
            continue
        lines = (root / src).read_text(encoding="utf-8", errors="replace").splitlines()
        for n, line in enumerate(lines, 1):
            m = INCLUDE_RE.match(line)
            if not m:
                continue
            target = resolve(root, src, m.group(1))
            where = f"{src.as_posix()}:{n}"
            if target is None:
                unresolved.append(f"{where} -> \"{m.group(1)}\" (no such file)")
                continue
            if target.parts[0] in NOT_ROOMS:
                continue
            there = room_of(target)
            if there == here:
                continue
            if there not in floor_of:
                unplaced.add(there)
                continue
            what = f"{where} -> {target.as_posix()}"
            edges[(here, there)].append(what)
            if floor_of[there] > floor_of[here]:
                up.append(f"{what}  ({here}, floor {floor_of[here]} -> {there}, "
                          f"floor {floor_of[there]})")
            elif floor_of[there] == floor_of[here] and (here, there) not in SIDEWAYS:
                sideways.append(f"{what}  (both on floor {floor_of[here]})")

    print("floors, lowest first (a file includes its own room and the rooms of lower floors):")
    for i, (name, rooms) in enumerate(FLOORS, 1):
        shown = [r if (root / r).is_dir() else r + " (no such folder)" for r in rooms]
        print(f"  {i:2}  {name}: {'  '.join(shown)}")

    for r in sorted(unplaced):
        print(f"room without a floor: {r} (add it to FLOORS in scripts/check_layers.py)")
    problems += len(unplaced)
    for u in unresolved:
        print(f"unresolved include: {u}")
    problems += len(unresolved)

    print(f"includes running back up: {len(up)}")
    for u in up:
        print(f"  {u}")
    problems += len(up)
    if sideways:
        print(f"includes between rooms of one floor (not in SIDEWAYS): {len(sideways)}")
        for s in sideways:
            print(f"  {s}")
        problems += len(sideways)

    # Each circle holds an include that does not run down; one circle per such room pair: the
    # pair, then the shortest way back down to where it started.
    circles = []
    for comp in cycles(edges):
        inside = set(comp)
        for a, b in sorted(edges):
            if a in inside and b in inside and floor_of[b] >= floor_of[a]:
                back = path_between(b, a, edges, inside)
                if back:
                    circles.append([a] + back)
    print(f"cycles between rooms: {len(circles)}")
    for circle in circles:
        print(f"  {' -> '.join(circle)}")
        for a, b in zip(circle, circle[1:]):
            whats = edges[(a, b)]
            more = f" (and {len(whats) - 1} more)" if len(whats) > 1 else ""
            print(f"      {whats[0]}{more}")
    problems += len(circles)

    if problems:
        print(f"layers: {problems} problem(s)")
        return 1
    print("layers: ok")
    return 0


if __name__ == "__main__":
    sys.exit(main())
