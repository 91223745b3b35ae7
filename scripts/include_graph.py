#!/usr/bin/env python3
"""Which folders of core/src/engine include which, so a circle shows at a glance.

Prints a table of `#include "engine/..."` edges between the engine's folders (rows include
columns; "." is the engine's top level), the cycles between folders, and with --edges each
file-level edge that crosses folders. Exits 1 when a cycle exists, so CI can hold the line.
"""
import argparse
import pathlib
import re
import sys

ENGINE = pathlib.Path(__file__).resolve().parent.parent / "core" / "src" / "engine"
INCLUDE = re.compile(r'^\s*#\s*include\s+"engine/([^"]+)"', re.M)


def folder(rel):
    parts = pathlib.PurePosixPath(rel).parts
    return parts[0] if len(parts) > 1 else "."


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
    ap.add_argument("--root", type=pathlib.Path, default=ENGINE)
    args = ap.parse_args()

    edges = list(file_edges(args.root))
    folders = sorted({".", *(p.name for p in args.root.iterdir() if p.is_dir())})
    counts = {(a, b): 0 for a in folders for b in folders}
    graph = {}
    for src, dst in edges:
        a, b = folder(src), folder(dst)
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
            if folder(src) != folder(dst):
                print(f"  {src} -> {dst}")
    return 1 if found else 0


if __name__ == "__main__":
    sys.exit(main())
