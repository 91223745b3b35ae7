"""Writes the site's knob page from the core's knob table (core/src/common/knobs.cc, read through
nezha._core.knobs()), so the documented names, defaults and docs are the ones the engine reads.

usage: python scripts/gen_knob_docs.py OUT.md
"""
import sys

from nezha import _core

HEADER = """# Knobs

Every knob is an environment variable, declared once, with its default and its doc, in
`core/src/common/knobs.cc`; `python -c "import nezha; print(nezha._core.knobs())"` prints the same
table. This page is generated from it by `scripts/gen_knob_docs.py` (`make docs`). Where a doc says
so, a knob must be the same on every rank: the ranks agree on plans from it.

| variable | default | what it does |
|---|---|---|
"""


def cell(text: str) -> str:
    return text.replace("|", "\\|").replace("\n", " ")


def main() -> None:
    if len(sys.argv) != 2:
        sys.exit(__doc__)
    rows = [f"| `{name}` | {('`' + default + '`') if default else '(empty)'} | {cell(doc)} |"
            for name, default, doc in _core.knobs()]
    with open(sys.argv[1], "w") as out:
        out.write(HEADER + "\n".join(rows) + "\n")


if __name__ == "__main__":
    main()
