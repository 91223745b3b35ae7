"""DistributedOptimizer, broadcast helpers and SyncBatchNorm against single-process torch.

The reference is the same model trained by plain torch on the concatenation of every rank's batch;
every rank regenerates all batches from seeds, so it computes the reference itself.
"""

import copy
import warnings

import torch
import torch.nn as nn

import nezha.torch as hvd
from common import assert_close, assert_identical_on_all_ranks, fail, report

BATCH = 4  # per rank


class Net(nn.Module):
    def __init__(self):
        super().__init__()
        self.fc1 = nn.Linear(5, 8)
        self.fc2 = nn.Linear(8, 3)
        self.unused = nn.Parameter(torch.ones(2))  # never in the forward pass
        self.frozen = nn.Linear(3, 3)
        self.frozen.requires_grad_(False)

    def forward(self, x):
        return self.frozen(self.fc2(torch.relu(self.fc1(x))))


def batch(rank, step, micro=0):
    g = torch.Generator().manual_seed(10000 * step + 100 * micro + rank)
    return torch.randn(BATCH, 5, generator=g), torch.randint(0, 3, (BATCH,), generator=g)


def loss_fn(model, x, y):
    return nn.functional.cross_entropy(model(x), y)


def fresh_model():
    torch.manual_seed(0)
    return Net()


def reference_grads(model, step, size, micro_batches=1):
    """Plain torch on the concatenated batch of all ranks (mean loss over the global batch)."""
    model.zero_grad(set_to_none=True)
    for m in range(micro_batches):
        xs, ys = zip(*[batch(k, step, m) for k in range(size)])
        loss_fn(model, torch.cat(xs), torch.cat(ys)).backward()
    return {name: p.grad.clone() for name, p in model.named_parameters() if p.grad is not None}


def check_training(rank, size, steps=3, compression=hvd.Compression.none, passes=1, groups=None,
                   tol=1e-6, label="plain"):
    model = fresh_model()
    reference = copy.deepcopy(model)
    opt = hvd.DistributedOptimizer(torch.optim.SGD(model.parameters(), lr=0.1, momentum=0.9),
                                   named_parameters=model.named_parameters(),
                                   compression=compression, backward_passes_per_step=passes,
                                   groups=groups)
    ref_opt = torch.optim.SGD(reference.parameters(), lr=0.1, momentum=0.9)
    if not isinstance(opt, torch.optim.SGD):
        fail("DistributedOptimizer is not an instance of the wrapped optimizer's class")
    for step in range(steps):
        opt.zero_grad()
        for m in range(passes):
            x, y = batch(rank, step, m)
            loss_fn(model, x, y).backward()
        if step == 0 and passes == 1:
            try:
                opt.zero_grad()
                fail("zero_grad() with gradients in flight did not raise")
            except AssertionError:
                pass
        opt.step()
        expected = reference_grads(reference, step, size, passes)
        for name, p in model.named_parameters():
            if name.startswith("frozen"):
                if p.grad is not None:
                    fail("frozen parameter %s got a gradient" % name)
            elif name == "unused":
                assert_close(p.grad, torch.zeros(2), "unused parameter's gradient")
            else:
                assert_close(p.grad, expected[name], "%s step %d grad %s" % (label, step, name),
                             rtol=tol, atol=tol)
        ref_opt.step()
        assert_identical_on_all_ranks([p for p in model.parameters()], "%s.params.%d" % (label, step))
    for (name, p), q in zip(model.named_parameters(), reference.parameters()):
        if name != "unused":  # the reference never gives it a gradient (zeros + momentum: no-op)
            assert_close(p, q, "%s params after %d steps: %s" % (label, steps, name), rtol=tol * 10,
                         atol=tol * 10)
    report("DistributedOptimizer %s" % label)


class SparseNet(nn.Module):
    def __init__(self):
        super().__init__()
        self.emb = nn.Embedding(10, 4, sparse=True)
        self.fc = nn.Linear(4, 3)

    def forward(self, idx):
        return self.fc(self.emb(idx).mean(1))


def sparse_batch(rank, step):
    g = torch.Generator().manual_seed(500 + 10 * step + rank)
    return torch.randint(0, 10, (BATCH, 3), generator=g), torch.randint(0, 3, (BATCH,), generator=g)


def check_sparse_training(rank, size, sparse_as_dense, steps=2):
    """An embedding with sparse gradients: reduced as sparse tensors, or densified first; either
    way the optimizer is handed a sparse gradient, as Horovod does (SparseAdam needs one)."""
    torch.manual_seed(0)
    model = SparseNet()
    reference = copy.deepcopy(model)
    opt = hvd.DistributedOptimizer(torch.optim.SGD(model.parameters(), lr=0.1),
                                   named_parameters=model.named_parameters(),
                                   sparse_as_dense=sparse_as_dense)
    ref_opt = torch.optim.SGD(reference.parameters(), lr=0.1)
    label = "sparse_as_dense" if sparse_as_dense else "sparse gradients"
    for step in range(steps):
        opt.zero_grad()
        x, y = sparse_batch(rank, step)
        nn.functional.cross_entropy(model(x), y).backward()
        opt.step()
        reference.zero_grad(set_to_none=True)
        xs, ys = zip(*[sparse_batch(k, step) for k in range(size)])
        nn.functional.cross_entropy(reference(torch.cat(xs)), torch.cat(ys)).backward()
        for (name, p), q in zip(model.named_parameters(), reference.parameters()):
            if name == "emb.weight" and not p.grad.is_sparse:
                fail("%s: embedding gradient is_sparse=%s" % (label, p.grad.is_sparse))
            dense = lambda g: g.to_dense() if g.is_sparse else g  # noqa: E731
            assert_close(dense(p.grad), dense(q.grad), "%s step %d grad %s" % (label, step, name),
                         rtol=1e-6, atol=1e-6)
        ref_opt.step()
        assert_identical_on_all_ranks(list(model.parameters()), "%s.params.%d" % (label, step))
    report("DistributedOptimizer %s" % label)


def check_grad_scaler(rank, size):
    """Horovod's documented pattern: synchronize(), unscale_/clip, then step in skip_synchronize."""
    model = fresh_model()
    reference = copy.deepcopy(model)
    opt = hvd.DistributedOptimizer(torch.optim.SGD(model.parameters(), lr=0.1),
                                   named_parameters=model.named_parameters())
    scaler = torch.amp.GradScaler("cpu", init_scale=1024.0)
    x, y = batch(rank, 0)
    scaler.scale(loss_fn(model, x, y)).backward()
    opt.synchronize()
    scaler.unscale_(opt)
    with warnings.catch_warnings():
        warnings.simplefilter("error")  # no "synchronized twice" warning
        with opt.skip_synchronize():
            scaler.step(opt)
    scaler.update()
    expected = reference_grads(reference, 0, size)
    for name, p in model.named_parameters():
        if name in expected:
            assert_close(p.grad, expected[name], "GradScaler grad %s" % name, rtol=1e-5, atol=1e-6)
    report("GradScaler with synchronize/skip_synchronize")


def check_broadcast_state(rank, size):
    torch.manual_seed(rank)  # every rank starts different
    model = Net()
    opt = torch.optim.Adam(model.parameters(), lr=0.01)
    if rank == 0:  # only the root has optimizer state
        x, y = batch(rank, 0)
        loss_fn(model, x, y).backward()
        opt.step()
    hvd.broadcast_parameters(model.state_dict(), root_rank=0)
    hvd.broadcast_optimizer_state(opt, root_rank=0)
    assert_identical_on_all_ranks(list(model.state_dict().values()), "broadcast_parameters")
    state = [t for s in opt.state_dict()["state"].values() for t in s.values()]
    if not state:
        fail("optimizer state was not received")
    assert_identical_on_all_ranks(state, "broadcast_optimizer_state")
    report("broadcast_parameters and broadcast_optimizer_state")


def check_sync_batch_norm(rank, size):
    torch.manual_seed(3)
    local = hvd.SyncBatchNorm(4)
    local.weight.data.uniform_(0.5, 1.5)
    local.bias.data.uniform_(-0.5, 0.5)
    reference = nn.BatchNorm1d(4)
    reference.load_state_dict(local.state_dict())
    xs = [torch.randn(3 + k, 4, 2, generator=torch.Generator().manual_seed(70 + k), dtype=torch.float64)
          for k in range(size)]  # uneven batches per rank
    ws = [torch.randn(3 + k, 4, 2, generator=torch.Generator().manual_seed(90 + k), dtype=torch.float64)
          for k in range(size)]
    local.double()
    reference.double()
    x = xs[rank].clone().requires_grad_()
    (local(x) * ws[rank]).sum().backward()
    full = torch.cat(xs).requires_grad_()
    out = reference(full)
    (out * torch.cat(ws)).sum().backward()
    start = sum(3 + k for k in range(rank))
    local_out = local(xs[rank].clone())  # a second batch: output uses the global statistics
    assert_close(local_out.detach(), out[start:start + 3 + rank].detach(), "SyncBatchNorm output",
                 rtol=1e-9, atol=1e-9)
    assert_close(x.grad, full.grad[start:start + 3 + rank], "SyncBatchNorm input grad",
                 rtol=1e-9, atol=1e-9)
    summed_w = hvd.allreduce(local.weight.grad, op=hvd.Sum)
    assert_close(summed_w, reference.weight.grad, "SyncBatchNorm weight grad", rtol=1e-9, atol=1e-9)
    reference(torch.cat(xs))  # the reference saw two batches too
    assert_close(local.running_mean, reference.running_mean, "running_mean", rtol=1e-9, atol=1e-9)
    assert_close(local.running_var, reference.running_var, "running_var", rtol=1e-9, atol=1e-9)
    report("SyncBatchNorm")


def main():
    hvd.init()
    rank, size = hvd.rank(), hvd.size()
    check_training(rank, size)
    check_training(rank, size, passes=2, label="backward_passes_per_step=2")
    check_training(rank, size, groups=2, label="groups=2")
    check_training(rank, size, compression=hvd.Compression.fp16, tol=2e-3, label="fp16")
    check_sparse_training(rank, size, sparse_as_dense=False)
    check_sparse_training(rank, size, sparse_as_dense=True)
    check_grad_scaler(rank, size)
    check_broadcast_state(rank, size)
    check_sync_batch_norm(rank, size)
    hvd.shutdown()


if __name__ == "__main__":
    main()
