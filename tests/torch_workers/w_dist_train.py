"""DDP and FSDP2 on the backend "nezha" against one process training on the full batch.

Each rank trains on its slice of a batch; the reference (computed here, in this process, without
any communication) trains the same model on the whole batch. DDP (default, gradient_as_bucket_view,
static_graph, small buckets, no_sync accumulation) and FSDP2's fully_shard (and, on 4 ranks, HSDP
over a 2 x 2 DeviceMesh) must match it to 1e-5; DDP with the fp16 / bf16 compression hooks and
PowerSGD must keep every rank's parameters bit-identical and learn (their gradients are
approximations by design). With argv[1] "cuda" (a GPU machine), DDP trains on CUDA tensors, each
rank on GPU local_rank % count, staged through pinned memory as nezha.torch stages them."""

import os
import sys

import copy

import torch
import torch.distributed as dist
import torch.nn as nn

from dist_common import assert_identical_on_all_ranks, expect, fail, report

STEPS, LOCAL_BATCH, LR = 4, 6, 0.05


DEVICE = sys.argv[1] if len(sys.argv) > 1 else "cpu"


def model():
    torch.manual_seed(1234)
    return nn.Sequential(nn.Linear(12, 32), nn.Tanh(), nn.Linear(32, 32), nn.Tanh(),
                         nn.Linear(32, 3))


def batch(step, n):
    g = torch.Generator().manual_seed(99 + step)
    return torch.randn(n * LOCAL_BATCH, 12, generator=g), torch.randn(n * LOCAL_BATCH, 3,
                                                                      generator=g)


def local(tensor, rank):
    return tensor[rank * LOCAL_BATCH:(rank + 1) * LOCAL_BATCH].to(DEVICE)


def reference(steps=STEPS, micro=1):
    """The full batch in one process: with `micro` micro-batches per step, gradients summed over
    them as DDP's no_sync accumulation does."""
    ref = model()
    opt = torch.optim.SGD(ref.parameters(), lr=LR)
    for step in range(steps):
        opt.zero_grad()
        for m in range(micro):
            x, y = batch(step * micro + m, N)
            nn.functional.mse_loss(ref(x), y).backward()
        opt.step()
    return [p.detach() for p in ref.parameters()]


def train(net, steps=STEPS, micro=1, no_sync=False, opt=None, first=0):
    opt = opt or torch.optim.SGD(net.parameters(), lr=LR)
    for step in range(first, first + steps):
        opt.zero_grad()
        for m in range(micro):
            x, y = batch(step * micro + m, N)
            last = m == micro - 1
            ctx = net.no_sync() if no_sync and not last else _nothing()
            with ctx:
                loss = nn.functional.mse_loss(net(local(x, RANK)), local(y, RANK))
                loss.backward()
        opt.step()
    return opt


class _nothing:
    def __enter__(self):
        return self

    def __exit__(self, *exc):
        return False


def full_params(net):
    """The parameters as full tensors (FSDP2's are DTensors sharded over the mesh)."""
    out = []
    for p in net.parameters():
        p = p.detach()
        out.append((p.full_tensor() if hasattr(p, "full_tensor") else p).cpu())
    return out


def assert_matches(params, want, what, atol=1e-5):
    for i, (p, w) in enumerate(zip(params, want)):
        if not torch.allclose(p, w, rtol=0, atol=atol):
            fail("%s: parameter %d differs from one process by %.3g" %
                 (what, i, (p - w).abs().max().item()))


def check_ddp():
    want = reference()
    DDP = nn.parallel.DistributedDataParallel
    for what, kwargs in (("DDP", {}), ("DDP gradient_as_bucket_view",
                                       {"gradient_as_bucket_view": True}),
                         ("DDP static_graph", {"static_graph": True}),
                         ("DDP small buckets", {"bucket_cap_mb": 0.001})):
        net = DDP(model().to(DEVICE), **kwargs)
        train(net)
        assert_matches(full_params(net.module), want, what)
        assert_identical_on_all_ranks(full_params(net.module), what)
        report(what + " matches one process")
    net = DDP(model().to(DEVICE))
    train(net, micro=2, no_sync=True)
    assert_matches(full_params(net.module), reference(micro=2), "DDP no_sync")
    report("DDP no_sync matches one process")


def check_ddp_comm_hooks():
    from torch.distributed.algorithms.ddp_comm_hooks import default_hooks, powerSGD_hook
    want = reference()

    def bf16_compress(state, bucket):
        # DDP refuses bf16_compress_hook by name without CUDA and NCCL; the hook itself is plain
        # torch.distributed (a bf16 allreduce, then a division), which this backend runs on CPU.
        return default_hooks.bf16_compress_hook(state, bucket)

    for what, hook in (("fp16_compress_hook", default_hooks.fp16_compress_hook),
                       ("bf16_compress_hook", bf16_compress)):
        net = nn.parallel.DistributedDataParallel(model())
        net.register_comm_hook(None, hook)
        train(net)
        assert_identical_on_all_ranks(full_params(net.module), what)
        # 16-bit gradients on the wire: near the exact result, not equal to it.
        assert_matches(full_params(net.module), want, what, atol=3e-3)
        report("DDP comm hook %s" % what)
    # PowerSGD allreduces plainly for its first 2 steps (exact), then exchanges low-rank factors
    # (an approximation) through allreduces of its own.
    state = powerSGD_hook.PowerSGDState(process_group=None, matrix_approximation_rank=2,
                                        start_powerSGD_iter=2, min_compression_rate=0.5)
    net = nn.parallel.DistributedDataParallel(model())
    net.register_comm_hook(state, powerSGD_hook.powerSGD_hook)
    opt = train(net, steps=2)
    assert_matches(full_params(net.module), reference(steps=2), "PowerSGD's plain steps")
    train(net, steps=4, opt=opt, first=2)
    params = full_params(net.module)
    expect(all(torch.isfinite(p).all() for p in params), "PowerSGD: non-finite parameters")
    assert_identical_on_all_ranks(params, "PowerSGD")
    report("DDP comm hook PowerSGD")


def check_fsdp2():
    from torch.distributed.device_mesh import init_device_mesh
    from torch.distributed.fsdp import fully_shard
    want = reference()
    meshes = [("FSDP2", init_device_mesh("cpu", (N,)))]
    if N == 4:
        meshes.append(("HSDP 2 x 2", init_device_mesh("cpu", (2, 2),
                                                       mesh_dim_names=("replicate", "shard"))))
    for what, mesh in meshes:
        net = model()
        for layer in net:
            if isinstance(layer, nn.Linear):
                fully_shard(layer, mesh=mesh)
        fully_shard(net, mesh=mesh)
        train(net)
        params = full_params(net)
        assert_matches(params, want, what)
        assert_identical_on_all_ranks(params, what)
        report(what + " matches one process")


if DEVICE == "cuda":
    torch.cuda.set_device(int(os.environ["LOCAL_RANK"]) % torch.cuda.device_count())
dist.init_process_group("nezha")
RANK, N = dist.get_rank(), dist.get_world_size()
try:
    check_ddp()
    if DEVICE == "cpu":
        check_ddp_comm_hooks()
        check_fsdp2()
finally:
    dist.destroy_process_group()
