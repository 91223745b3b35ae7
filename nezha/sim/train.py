"""A training step: compute, and the gradients' allreduces as the backward pass makes them ready.

The forward pass takes a third of the step's compute, the backward pass the rest; a layer's
gradients become ready when the backward pass has gone through it, in proportion to its share of
the parameters (true of dense layers, close for convolutions). The engine takes every gradient
ready when it is free: tensors of NEZHA_UNFUSED_BYTES or more run alone, the smaller ones are fused
up to NEZHA_FUSION_THRESHOLD (the engine's own rules, fusion.cc), one operation after another, each
through SimJob.allreduce (planned, balanced and failed over by the engine's own objects). The step
ends when both the compute and the last allreduce have. Where the compute holds every core the
communication needs (profile.compute_blocks_communication), nothing overlaps: the gradients go out
when the backward pass is over.
"""
from __future__ import annotations

import statistics
from dataclasses import dataclass
from typing import Dict, List, Sequence, Tuple

from nezha._core import planner

from .engine import SimJob


@dataclass(frozen=True)
class ModelSpec:
    name: str
    tensors: Tuple[Tuple[str, int], ...]   # (name, float32 elements) in forward order
    note: str = ""

    @property
    def gradient_bytes(self) -> int:
        return 4 * sum(n for _, n in self.tensors)


def _dense(prefix: str, dims: Sequence[int]) -> List[Tuple[str, int]]:
    out: List[Tuple[str, int]] = []
    for i, (a, b) in enumerate(zip(dims, dims[1:])):
        out += [(f"{prefix}{i}.weight", a * b), (f"{prefix}{i}.bias", b)]
    return out


def _resnet50() -> List[Tuple[str, int]]:
    """ResNet-50's 161 parameter tensors by stage (25.6M parameters), conv weights then BN pairs."""
    out: List[Tuple[str, int]] = [("conv1", 3 * 64 * 49), ("bn1.w", 64), ("bn1.b", 64)]
    cin = 64
    for stage, (width, blocks) in enumerate([(64, 3), (128, 4), (256, 6), (512, 3)]):
        for b in range(blocks):
            cout = width * 4
            for name, n, ch in (("a", cin * width, width), ("b", width * width * 9, width), ("c", width * cout, cout)):
                out += [(f"l{stage}.{b}.{name}", n), (f"l{stage}.{b}.{name}.bn.w", ch), (f"l{stage}.{b}.{name}.bn.b", ch)]
            if b == 0:
                out += [(f"l{stage}.down", cin * cout), (f"l{stage}.down.bn.w", cout), (f"l{stage}.down.bn.b", cout)]
            cin = cout
    return out + [("fc.weight", 2048 * 1000), ("fc.bias", 1000)]


def _vgg16() -> List[Tuple[str, int]]:
    """VGG-16 (138M parameters): 13 convolutions, then three dense layers holding most of them."""
    out: List[Tuple[str, int]] = []
    cin = 3
    for i, cout in enumerate([64, 64, 128, 128, 256, 256, 256, 512, 512, 512, 512, 512, 512]):
        out += [(f"conv{i}.weight", cin * cout * 9), (f"conv{i}.bias", cout)]
        cin = cout
    return out + _dense("fc", [512 * 7 * 7, 4096, 4096, 1000])


MODELS: Dict[str, ModelSpec] = {
    # examples/pytorch_synthetic_benchmark.py's mlp46m: Linear 6144->4096->4096, head 4096->1000.
    "mlp46m": ModelSpec("mlp46m", tuple(_dense("layers.", [6144, 4096, 4096]) + _dense("head.", [4096, 1000])),
                        "the testbed's communication-heavy model (184 MB of gradients)"),
    "resnet50": ModelSpec("resnet50", tuple(_resnet50()), "ImageNet ResNet-50 (102 MB of gradients)"),
    "vgg16": ModelSpec("vgg16", tuple(_vgg16()), "ImageNet VGG-16 (553 MB of gradients)"),
}


def model(name: str) -> ModelSpec:
    if name not in MODELS:
        raise ValueError(f"no model '{name}' (known: {', '.join(sorted(MODELS))})")
    return MODELS[name]


def _ready_times(spec: ModelSpec, compute_s: float) -> List[Tuple[float, int]]:
    """(time the gradient is ready, bytes) in the order the backward pass makes them."""
    forward, backward = compute_s / 3, compute_s * 2 / 3
    total = sum(n for _, n in spec.tensors)
    t, out = forward, []
    for _, n in reversed(spec.tensors):
        t += backward * n / total
        out.append((t, 4 * n))
    return out


def step(job: SimJob, spec: ModelSpec, compute_s: float) -> float:
    """One training step from job.now; returns its length (job.now moves to its end)."""
    p = job.profile
    start = job.now
    ready = _ready_times(spec, compute_s)
    if p.compute_blocks_communication:
        ready = [(max(t, compute_s), b) for t, b in ready]
    pending = [(start + t, b) for t, b in ready]
    free = start
    while pending:
        free = max(free, pending[0][0])
        ready = [x for x in pending if x[0] <= free]
        # Fusion's unfused threshold as rank 0 scales it to its rails' estimates.
        unfused = planner.scaled_unfused_bytes(p.unfused_bytes, job.table.estimates())
        big = [x for x in ready if unfused and x[1] >= unfused]
        if big:
            op = [big[0]]
        else:
            op, size = [], 0
            for x in ready:
                if op and p.fusion_bytes and size + x[1] > p.fusion_bytes:
                    break
                op.append(x)
                size += x[1]
        for x in op:
            pending.remove(x)
        # The coordinator takes what is ready once per cycle: half a cycle's wait on average.
        job.now = free + p.cycle_ms * 0.5e-3
        job.allreduce(sum(b for _, b in op))
        free = job.now
    end = max(free, start + compute_s)
    job.now = end
    return end - start


def samples_per_second(job: SimJob, spec: ModelSpec, compute_s: float, batch_size: int,
                       steps: int = 6, warmup: int = 2) -> Tuple[float, float]:
    """(samples/s of the whole job, median step seconds) over `steps` after `warmup` steps."""
    if steps < 1 or warmup < 0:
        raise ValueError("steps must be >= 1 and warmup >= 0")
    times = [step(job, spec, compute_s) for _ in range(warmup + steps)][warmup:]
    median = statistics.median(times)
    return batch_size * job.cluster.ranks / median, median
