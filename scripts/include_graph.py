#!/usr/bin/env python3
"""Which folders of core/src/engine include which, so a circle shows at a glance.

Prints a table of `#include "engine/..."` edges between the engine's folders (rows include
columns; "." is the engine's top level), the cycles between folders, and with --edges each
file-level edge that crosses folders. Exits 1 when a cycle exists.

The top level holds two layers: the types every folder shares (request.h, handle.h, ...) and the
Engine class that composes the folders (engine.h, engine_internal.h, engine*.cc). Counted as one
node they always form a circle with any folder that names a shared type; --engine-apart counts the
Engine's top-level files as a node of their own, "Engine", which is the view where one-way
includes mean: shared types <- execution, failover, negotiation <- Engine.

With --engine-apart it also checks the layering itself, not only the absence of circles: each node
may include only the nodes ALLOWED names (nothing upward, no component including engine.h or
engine_internal.h, no component reaching into another's folder unless listed), and exits 1 naming
every file edge that breaks it.
"""
import argparse
import pathlib
import re
import sys

ENGINE = pathlib.Path(__file__).resolve().parent.parent / "core" / "src" / "engine"
# Which nodes each node may include (besides itself), in the --engine-apart view. The components
# (negotiation, failover, execution) meet only through the interfaces the Engine wires; the rail
# watchdog lives with failover but is the executor's tool, hence execution -> failover.
ALLOWED = {
    ".": set(),
    "negotiation": {"."},
    "failover": {"."},
    "execution": {".", "failover"},
    "Engine": {".", "negotiation", "failover", "execution"},
}
INCLUDE = re.compile(r'^\s*#\s*include\s+"engine/([^"]+)"', re.M)


def folder(rel, engine_apart=False):
    parts = pathlib.PurePosixPath(rel).parts
    if len(parts) > 1:
        return parts[0]
    return "Engine" if engine_apart and parts[0].startswith("engine") else "."


def file_edges(root):
    for path in sorted(root.rglob("*")):
        if path.suffix not in (".h", ".cc"):
            continue
        src = path.relative_to(root).as_posix()
        for target in INCLUDE.findall(path.read_text()):
            yield src, target


def cycles(graph):
    """Elementary cycles of a small graph, each reported once from its smallest node."""
    found = []

    def walk(start, node, path):
        for nxt in sorted(graph.get(node, ())):
            if nxt == start:
                found.append(path + [start])
            elif nxt > start and nxt not in path:
                walk(start, nxt, path + [nxt])

    for start in sorted(graph):
        walk(start, start, [start])
    return found


def main():
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--edges", action="store_true", help="list each cross-folder file edge")
    ap.add_argument("--engine-apart", action="store_true",
                    help="count the Engine's top-level files apart from the shared types")
    ap.add_argument("--root", type=pathlib.Path, default=ENGINE)
    args = ap.parse_args()
    node = lambda rel: folder(rel, args.engine_apart)

    edges = list(file_edges(args.root))
    folders = sorted({".", *(p.name for p in args.root.iterdir() if p.is_dir())})
    if args.engine_apart:
        folders.append("Engine")
    counts = {(a, b): 0 for a in folders for b in folders}
    graph = {}
    for src, dst in edges:
        a, b = node(src), node(dst)
        counts[a, b] = counts.get((a, b), 0) + 1
        if a != b:
            graph.setdefault(a, set()).add(b)

    width = max(len(f) for f in folders) + 2
    print("includes ->".ljust(width) + "".join(f.rjust(width) for f in folders))
    for a in folders:
        print(a.ljust(width) + "".join(str(counts[a, b]).rjust(width) for b in folders))

    found = cycles(graph)
    print("\ncycles between folders:" + ("" if found else " none"))
    for c in found:
        print("  " + " -> ".join(c))

    if args.edges:
        print("\ncross-folder file edges:")
        for src, dst in edges:
            if node(src) != node(dst):
                print(f"  {src} -> {dst}")
    bad = []
    if args.engine_apart:
        for src, dst in edges:
            a, b = node(src), node(dst)
            if a != b and b not in ALLOWED.get(a, set()):
                why = ("a component includes the Engine" if b == "Engine"
                       else f"{a} may include only {sorted(ALLOWED.get(a, set())) or 'nothing'}")
                bad.append(f"  {src} -> {dst} ({why})")
        print("\nincludes against the layering:" + ("" if bad else " none"))
        for line in bad:
            print(line)
    return 1 if found or bad else 0


if __name__ == "__main__":
    sys.exit(main())
