"""benchmarks/busbw.png: busbw against message size, one subplot per case, one line per impl."""
from __future__ import annotations

from typing import Sequence

from matrix_report import CaseResult


def write_plot(results: Sequence[CaseResult], path: str) -> None:
    import matplotlib
    matplotlib.use("Agg")  # files only; no display on the benchmark hosts
    import matplotlib.pyplot as plt
    from matplotlib.ticker import FuncFormatter

    from nezha.bench.sizes import format_size

    fig, axes = plt.subplots(1, max(1, len(results)), figsize=(5.5 * max(1, len(results)), 4.2),
                             squeeze=False)
    for ax, res in zip(axes[0], results):
        for impl in res.impls():
            points = sorted((r.bytes, r.busbw_gbps) for r in res.records if r.impl == impl)
            if points:
                # Baselines dashed so nezha's variants stand out.
                ax.plot([p[0] for p in points], [p[1] for p in points], marker="o", label=impl,
                        linestyle="--" if impl.startswith("gloo") else "-")
        ax.set_xscale("log", base=2)
        ax.xaxis.set_major_formatter(FuncFormatter(lambda x, _: format_size(int(x)) if x >= 1 else ""))
        ax.set_title(f"({res.case.key}) {res.case.title}", fontsize=10)
        ax.set_xlabel("bytes per rank")
        ax.set_ylabel("busbw (Gbit/s)")
        ax.grid(True, which="both", alpha=0.3)
        if ax.lines:
            ax.legend(fontsize=8)
    fig.suptitle("allreduce float32, 4 ranks")
    fig.tight_layout()
    fig.savefig(path, dpi=110)
    plt.close(fig)
