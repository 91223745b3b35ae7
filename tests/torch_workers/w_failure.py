"""After a case fails on some ranks only, the job goes on in step.

Horovod-test style: the cases run one after the other in the same processes. The first fails on
rank 1 only (an exception in user code between two collectives), so rank 0 waits for a tensor rank
1 will never submit; the second is a mismatch (a grouped allreduce of 2 tensors on rank 0, 3 on the
others). Run with a short NEZHA_STALL_CHECK_S (every rank must log which tensor waits for which
ranks) and NEZHA_STALL_SHUTDOWN_S (the stalled tensor then fails on the ranks waiting for it). The
last case, a DistributedOptimizer on a two-convolution model without named_parameters, must then
train exactly like one process would.
"""

import time

import torch

import nezha.torch as hvd
from common import assert_close, fail, report


class _UserError(Exception):
    pass


def case_exception_between_collectives(rank, size):
    try:
        hvd.allreduce(torch.ones(3), name="before.exception")
        if rank == 1:
            raise _UserError("a failed assertion in the test itself")
        hvd.allreduce(torch.ones(3), name="after.exception")  # rank 1 never gets here
        fail("the allreduce only some ranks submitted returned")
    except _UserError:
        time.sleep(1.0)  # the failing rank goes on to the next case a little later
    except hvd.NezhaError as error:
        if "after.exception" not in str(error) or "rank 1" not in str(error):
            fail("the stall error does not name the tensor and the missing rank: %s" % error)
    report("exception between collectives")


def case_mismatched_group(rank, size):
    tensors = [torch.full((2,), float(i)) for i in range(2 if rank == 0 else 3)]
    try:
        hvd.grouped_allreduce(tensors, name="mismatched.group")
        fail("grouped allreduces of different sizes did not raise")
    except hvd.NezhaError as error:
        if "mismatched.group" not in str(error):
            fail("group mismatch error does not name the group: %s" % error)
    assert_close(hvd.allreduce(torch.ones(2), op=hvd.Sum, name="after.mismatch"),
                 torch.full((2,), float(size)), "allreduce after the mismatch")
    report("mismatched group")


def _two_conv_model():
    torch.manual_seed(3)
    return torch.nn.Sequential(torch.nn.Conv2d(1, 4, 3), torch.nn.ReLU(), torch.nn.Conv2d(4, 2, 3),
                               torch.nn.Flatten(), torch.nn.Linear(2 * 4 * 4, 1))


def _batch(rank, step):
    g = torch.Generator().manual_seed(100 * step + rank)
    return torch.rand((2, 1, 8, 8), generator=g), torch.rand((2, 1), generator=g)


def case_optimizer_without_named_parameters(rank, size):
    model, reference = _two_conv_model(), _two_conv_model()
    optimizer = hvd.DistributedOptimizer(torch.optim.SGD(model.parameters(), lr=0.1))
    ref_optimizer = torch.optim.SGD(reference.parameters(), lr=0.1)
    hvd.broadcast_parameters(model.state_dict(), root_rank=0)
    for step in range(3):
        optimizer.zero_grad()
        x, y = _batch(rank, step)
        torch.nn.functional.mse_loss(model(x), y).backward()
        optimizer.step()
        ref_optimizer.zero_grad()
        batches = [_batch(r, step) for r in range(size)]
        loss = sum(torch.nn.functional.mse_loss(reference(bx), by) for bx, by in batches) / size
        loss.backward()
        ref_optimizer.step()
    for p, q in zip(model.parameters(), reference.parameters()):
        assert_close(p, q, "two-convolution model after 3 steps", rtol=1e-5, atol=1e-6)
    report("optimizer after failures")


def main():
    hvd.init()
    rank, size = hvd.rank(), hvd.size()
    for case in (case_exception_between_collectives, case_mismatched_group,
                 case_optimizer_without_named_parameters):
        case(rank, size)
    hvd.shutdown()


if __name__ == "__main__":
    main()
