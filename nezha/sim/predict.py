"""`python -m nezha.sim predict`: 8 to 1024 nodes of the kind of cluster the seeds measured.

Clusters (one rank per node: a node's GPUs reduced inside the node first is left out):
  * two planes: RDMA at 100 Gbit/s (libfabric, `ofi`) and Ethernet/TCP at 25 Gbit/s;
  * three planes: the same plus in-network aggregation (SHARP-style) at 100 Gbit/s.
Nezha stripes over every plane; Gloo runs on the TCP plane (one NIC); MPTCP stripes the TCP planes
only (it cannot drive RDMA or an aggregation switch). Outputs allreduce busbw per size and the
training efficiency (samples/s over nodes x one node's samples/s) of ResNet-50 and VGG-16, whose
per-step compute on a V100 is the profile's (extra.compute_ms_<model>).
"""
from __future__ import annotations

import json
from pathlib import Path
from typing import Dict, List

from nezha.bench.sizes import format_size

from . import baselines
from . import train as train_model
from .cli import allreduce_records
from .cluster import Cluster, Profile, load_profile, parse_rails
from .engine import SimJob

CLUSTERS = {
    "2 planes (RDMA 100G + TCP 25G)": "ofi:100gbit,tcp:25gbit",
    "3 planes (RDMA 100G + TCP 25G + aggregation 100G)": "ofi:100gbit,tcp:25gbit,agg:100gbit",
}
SIZES = [1 << 20, 64 << 20]
TRAIN_MODELS = ("resnet50", "vgg16")
BATCH = 32


def _impls(cluster: Cluster, profile: Profile) -> Dict[str, tuple]:
    return {"nezha": (cluster, profile),
            "gloo": (baselines.gloo_cluster(cluster), baselines.gloo_profile(profile)),
            "mptcp": (baselines.mptcp_cluster(cluster, profile), profile)}


def predict(nodes: List[int], profile: Profile) -> Dict:
    out: Dict = {"profile": profile.name, "profile_source": profile.source, "clusters": {}}
    for title, rails in CLUSTERS.items():
        series: Dict = {"rails": rails, "busbw": {}, "training": {}}
        for n in nodes:
            base = Cluster(n, 1, parse_rails(rails))
            for impl, (cluster, prof) in _impls(base, profile).items():
                for rec in allreduce_records(cluster, prof, SIZES, iters=5, warmup=3):
                    series["busbw"].setdefault(impl, {}).setdefault(format_size(rec["bytes"]), []).append(
                        {"nodes": n, "busbw_gbps": rec["busbw_gbps"], "time_us": rec["time_us"]})
                for name in TRAIN_MODELS:
                    compute_s = profile.extra[f"compute_ms_{name}"] * 1e-3
                    job = SimJob(cluster, prof)
                    _, step_s = train_model.samples_per_second(job, train_model.model(name), compute_s, BATCH,
                                                               steps=3, warmup=2)
                    series["training"].setdefault(impl, {}).setdefault(name, []).append(
                        {"nodes": n, "step_s": step_s, "efficiency": compute_s / step_s})
        out["clusters"][title] = series
    return out


def markdown(result: Dict) -> str:
    lines = [f"Profile `{result['profile']}` ({result['profile_source']}).", ""]
    for title, series in result["clusters"].items():
        lines += [f"#### {title} (`--rails {series['rails']}`)", "",
                  "| nodes | " + " | ".join(f"{impl} {size} busbw" for impl in series["busbw"]
                                            for size in series["busbw"][impl]) + " | "
                  + " | ".join(f"{impl} {m} eff." for impl in series["training"] for m in series["training"][impl])
                  + " | nezha / gloo eff. (" + ", ".join(TRAIN_MODELS) + ") |"]
        cols = sum(len(v) for v in series["busbw"].values()) + sum(len(v) for v in series["training"].values()) + 2
        lines.append("|" + "---:|" * cols)
        nodes = [p["nodes"] for p in next(iter(next(iter(series["busbw"].values())).values()))]
        for i, n in enumerate(nodes):
            cells = [f"{series['busbw'][impl][size][i]['busbw_gbps']:.1f}" for impl in series["busbw"]
                     for size in series["busbw"][impl]]
            cells += [f"{series['training'][impl][m][i]['efficiency']:.2f}" for impl in series["training"]
                      for m in series["training"][impl]]
            ratios = [series["training"]["nezha"][m][i]["efficiency"] / series["training"]["gloo"][m][i]["efficiency"]
                      for m in TRAIN_MODELS]
            lines.append(f"| {n} | " + " | ".join(cells) + " | " + ", ".join(f"{r:.2f}x" for r in ratios) + " |")
        lines.append("")
    return "\n".join(lines)


def plot(result: Dict, plot_dir: Path) -> List[Path]:
    import matplotlib
    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    paths = []
    for kind, ylabel, name in (("busbw", "allreduce busbw (Gbit/s)", "predict_busbw.png"),
                               ("training", "training efficiency", "predict_training.png")):
        fig, axes = plt.subplots(1, len(result["clusters"]), figsize=(6 * len(result["clusters"]), 4.2), squeeze=False)
        for ax, (title, series) in zip(axes[0], result["clusters"].items()):
            for impl, per in series[kind].items():
                for key, points in per.items():
                    ys = [p["busbw_gbps" if kind == "busbw" else "efficiency"] for p in points]
                    ax.plot([p["nodes"] for p in points], ys, marker="o", label=f"{impl} {key}")
            ax.set_xscale("log", base=2)
            ax.set_xlabel("nodes (one rank each)")
            ax.set_ylabel(ylabel)
            ax.set_title(title, fontsize=9)
            ax.grid(True, alpha=0.3)
            ax.legend(fontsize=7)
        fig.tight_layout()
        path = plot_dir / name
        fig.savefig(path, dpi=110)
        plt.close(fig)
        paths.append(path)
    return paths


def run_prediction(args) -> int:
    nodes = [int(x) for x in args.nodes.split(",") if x.strip()]
    if not nodes or min(nodes) < 2:
        raise ValueError("--nodes needs node counts >= 2")
    result = predict(nodes, load_profile(args.profile))
    text = markdown(result)
    if args.json:
        Path(args.json).write_text(json.dumps(result, indent=2) + "\n")
    if args.markdown:
        Path(args.markdown).write_text(text)
    if args.plot_dir:
        for p in plot(result, Path(args.plot_dir)):
            print(f"wrote {p}")
    print(text)
    return 0
